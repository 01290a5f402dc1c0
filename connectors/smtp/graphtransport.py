"""Sending through Microsoft Graph: the only module of the sink that imports ``msal`` and
``httpx2`` (the ``graph`` extra), as :mod:`connectors.smtp.transport` is for aiosmtplib.

One ``POST /users/{user}/sendMail`` per message, the MIME base64-encoded
(:mod:`connectors.smtp.graphsubmit`), with an app-only token of the ``smtp.graph`` application
(MSAL's client-credentials grant with a secret or a certificate; MSAL caches the token and renews
it before it expires). The sink's guarantees hold as with a relay: the request body and the token
are ready while the command's INTENT commits, the request itself goes out only once it has
(``ready``), so a kill -9 before that sends nothing, and one after it leaves at most
``pool_size`` commands UNKNOWN, resent with the same Message-ID.

Where a request can end (every way is an outcome, never an exception):

- 202: SENT (queued; bounces come back as NDRs in the sending mailbox);
- 429/503/504: DEFERRED, and the whole transport waits ``Retry-After`` before its next request
  (learn.microsoft.com/graph/throttling: requests sent while throttled count against the limit);
  the sends meanwhile are DEFERRED without a request;
- 401: the cached token is dropped and the request made once more (it was refused, not
  accepted); a second 401 or a 403 ``ErrorAccessDenied`` is DEFERRED and logged as an error;
- other 4xx: FAILED; other 5xx: UNKNOWN;
- connect failure, timeout or drop while the request was still being written: DEFERRED
  (Graph cannot act on a request it did not receive whole); a timeout or drop while waiting
  for the answer: UNKNOWN.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
import time
from typing import Any
from urllib.parse import quote

import httpx2
import msal
import requests

from connectors.core.entra import (
    APP_SCOPES,
    TOKEN_REFUSALS,
    certificate_credential,
    forget_access_tokens,
    msal_http_session,
)
from connectors.core.redact import quiet_token_libraries
from connectors.smtp.classify import DeliveryStatus, RecipientOutcome
from connectors.smtp.config import GraphSendSettings, SmtpSinkSettings
from connectors.smtp.errors import GraphSetupError, GraphTokenError
from connectors.smtp.graphsubmit import (
    MAX_REQUEST_BYTES,
    THROTTLED,
    accepted,
    is_access_problem,
    refused,
    request_body,
    unanswered,
)
from connectors.smtp.render import RenderedMessage

__all__ = ["GraphTransport"]

log = logging.getLogger(__name__)
quiet_token_libraries()
logging.getLogger("msal").setLevel(logging.WARNING)  # at DEBUG it logs token responses
logging.getLogger("httpx2").setLevel(logging.WARNING)  # at INFO it logs every request
logging.getLogger("httpcore2").setLevel(logging.INFO)  # at DEBUG the headers (the token)

#: Without a Retry-After, a throttled transport waits this long (Graph sends one with 429).
DEFAULT_RETRY_AFTER_S = 5.0
#: A longer Retry-After is capped: the deferred commands come back through the retry tiers.
MAX_RETRY_AFTER_S = 600.0
#: Connecting (TCP + TLS) to Graph; an answer may take request_timeout.
CONNECT_TIMEOUT_S = 30.0


class _AppTokens:
    """The application's current access token (MSAL); thread-safe, called in worker threads."""

    def __init__(self, settings: GraphSendSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._app: msal.ConfidentialClientApplication | None = None

    def token(self) -> str:
        with self._lock:
            try:
                if self._app is None:
                    self._app = self._application()
                result = dict(self._app.acquire_token_for_client(scopes=APP_SCOPES) or {})
            except requests.RequestException as exc:
                raise GraphTokenError(
                    f"the token endpoint {self.settings.authority_host} is unreachable "
                    f"({type(exc).__name__})",
                    refused=False,
                ) from None
        if "access_token" in result:
            return str(result["access_token"])
        error = str(result.get("error", "unknown_error"))
        message = f"the token endpoint refused the application {self.settings.client_id}: {error}"
        description = result.get("error_description")
        if description:  # names the tenant and the client, never the secret
            message += f" ({str(description).splitlines()[0][:200]})"
        raise GraphTokenError(message, refused=error in TOKEN_REFUSALS)

    def refused(self) -> None:
        """Graph refused the current token (401): forget it, the next call gets a new one."""
        with self._lock:
            if self._app is None:
                return
            forget_access_tokens(self._app)

    def _application(self) -> msal.ConfidentialClientApplication:
        settings = self.settings
        options: dict[str, Any] = {
            "authority": f"{settings.authority_host}/{settings.tenant_id}",
            "http_client": msal_http_session(settings.ca_file),
        }
        if not settings.authority_host.startswith("https://login.microsoftonline.com"):
            options["instance_discovery"] = False  # a national cloud or the test server
        credential: Any = settings.secret()
        if settings.certificate_file is not None:
            password = settings.certificate_password
            credential = certificate_credential(
                settings.certificate_file.read_bytes(),
                password.get_secret_value() if password else None,
            )
        return msal.ConfidentialClientApplication(
            settings.client_id, client_credential=credential, **options
        )


class GraphTransport:
    """``sendMail`` for the sink's sender: at most ``pool_size`` requests in flight."""

    def __init__(self, settings: SmtpSinkSettings) -> None:
        assert settings.graph is not None, "transport graph without smtp.graph"
        self.settings = settings
        self.graph = settings.graph
        self.description = f"graph:{self.graph.user}"
        self.opened = 0
        self._tokens = _AppTokens(self.graph)
        self._url = f"{self.graph.api_base}/users/{quote(self.graph.user, safe='@.')}/sendMail"
        self._slots = asyncio.Semaphore(settings.pool_size)
        self._http: httpx2.AsyncClient | None = None
        self._held_until = 0.0
        """Monotonic time before which no request is made (the last Retry-After)."""

    def start(self) -> None:
        """Get a first token now: a refused credential stops the sink at start with a
        sentence; an unreachable endpoint only delays the sends (DEFERRED until it answers)."""
        try:
            self._tokens.token()
        except GraphTokenError as exc:
            if exc.refused:
                raise GraphSetupError(
                    f"smtp.graph: {exc.message}; check tenant_id, client_id and the secret or "
                    f"certificate, and that the application has the Mail.Send permission"
                ) from None
            log.warning("graph transport: %s; sends are deferred until it answers", exc.message)

    def reset_breaker(self) -> None:
        """Nothing to reset: a failure is per request (the Retry-After hold is time-bound)."""

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def deliver(
        self, message: RenderedMessage, ready: asyncio.Event | None = None
    ) -> list[RecipientOutcome]:
        """Send ``message`` once ``ready`` is set; the outcome of every recipient."""
        recipients = message.recipients
        body = request_body(message)
        if len(body) > MAX_REQUEST_BYTES:
            reason = (
                f"message of {len(message.data)} bytes is {len(body)} bytes base64-encoded, "
                f"over Microsoft Graph's {MAX_REQUEST_BYTES} byte request limit; larger "
                f"replies need transport smtp"
            )
            return [
                RecipientOutcome(r, DeliveryStatus.FAILED, diagnostic=reason) for r in recipients
            ]
        async with self._slots:
            held = self._held_for(recipients)
            if held is not None:
                return held
            try:
                token = await asyncio.to_thread(self._tokens.token)
            except GraphTokenError as exc:
                log.error("graph transport: %s", exc.message)
                return unanswered(recipients, f"no Graph token: {exc.message}", maybe_sent=False)
            if ready is not None:
                await ready.wait()
            held = self._held_for(recipients)  # another send may have been throttled meanwhile
            if held is not None:
                return held
            for attempt in range(2):
                outcomes = await self._post(recipients, body, token)
                if not isinstance(outcomes, httpx2.Response):
                    return outcomes
                response = outcomes
                code, text = _error(response)
                if response.status_code == 401 and attempt == 0:
                    # Refused before it was accepted: a new token, and the request once more.
                    self._tokens.refused()
                    try:
                        token = await asyncio.to_thread(self._tokens.token)
                    except GraphTokenError as exc:
                        log.error("graph transport: %s", exc.message)
                        return unanswered(
                            recipients, f"no Graph token: {exc.message}", maybe_sent=False
                        )
                    continue
                break
            if response.status_code in THROTTLED:
                wait = _retry_after(response)
                self._held_until = max(self._held_until, time.monotonic() + wait)
                log.warning(
                    "graph transport: sendMail answered %d; no request for %.0fs (Retry-After)",
                    response.status_code,
                    wait,
                )
                text = f"{text} (Retry-After {wait:g}s)".lstrip()
            elif is_access_problem(response.status_code, code):
                log.error(
                    "graph transport: Graph refused the application for %s: %d %s (check "
                    "smtp.graph and the Mail.Send permission)",
                    self.graph.user,
                    response.status_code,
                    code,
                )
            return refused(recipients, response.status_code, code, text)

    async def _post(
        self, recipients: tuple[str, ...], body: bytes, token: str
    ) -> list[RecipientOutcome] | httpx2.Response:
        """The request: its outcomes when it ended without an error answer to look at."""
        http = self._client()
        try:
            response = await http.post(
                self._url,
                content=body,
                headers={"Authorization": f"Bearer {token}", "Content-Type": "text/plain"},
            )
        except (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout) as exc:
            why = f"could not reach Microsoft Graph ({type(exc).__name__}); nothing was sent"
            return unanswered(recipients, why, maybe_sent=False)
        except (httpx2.WriteError, httpx2.WriteTimeout) as exc:
            why = f"connection lost while writing the request ({type(exc).__name__}); not sent"
            return unanswered(recipients, why, maybe_sent=False)
        except httpx2.HTTPError as exc:
            why = (
                f"no answer from Microsoft Graph after the request was sent "
                f"({type(exc).__name__}); Graph may have queued the message"
            )
            return unanswered(recipients, why, maybe_sent=True)
        if 200 <= response.status_code < 300:  # 202 Accepted, as documented
            return accepted(recipients)
        return response

    def _held_for(self, recipients: tuple[str, ...]) -> list[RecipientOutcome] | None:
        """DEFERRED outcomes while Graph's last Retry-After runs, else None."""
        remaining = self._held_until - time.monotonic()
        if remaining <= 0:
            return None
        why = (
            f"Microsoft Graph asked to wait (Retry-After): no request for another "
            f"{remaining:.0f}s; not sent"
        )
        return unanswered(recipients, why, maybe_sent=False)

    def _client(self) -> httpx2.AsyncClient:
        if self._http is None:
            self._http = httpx2.AsyncClient(
                timeout=httpx2.Timeout(self.graph.request_timeout, connect=CONNECT_TIMEOUT_S),
                verify=ssl.create_default_context(cafile=self.graph.ca_file)
                if self.graph.ca_file
                else True,
                limits=httpx2.Limits(
                    max_connections=self.settings.pool_size,
                    max_keepalive_connections=self.settings.pool_size,
                ),
                follow_redirects=False,
            )
            self.opened += 1
        return self._http


def _retry_after(response: httpx2.Response) -> float:
    value = response.headers.get("Retry-After")
    try:
        seconds = float(value) if value is not None else DEFAULT_RETRY_AFTER_S
    except ValueError:
        seconds = DEFAULT_RETRY_AFTER_S  # an HTTP date: Graph sends seconds
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def _error(response: httpx2.Response) -> tuple[str, str]:
    """Graph's ``error.code`` and ``error.message``, or ('', '') when the body has none."""
    try:
        body = response.json()
    except ValueError:
        return "", ""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return "", ""
    return str(error.get("code", "")), str(error.get("message", ""))
