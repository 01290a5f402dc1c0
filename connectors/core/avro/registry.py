"""The registry subjects of one topic, set up the way the contract says before the first write.

For a topic ``T`` mailtap uses TopicNameStrategy subjects and, before it writes there:

1. sets the compatibility of ``T-key`` and ``T-value`` (``kafka.schema_compatibility``,
   FULL_TRANSITIVE by default). A registry's own default is no guarantee: Apicurio's ccompat API
   answers ``NONE`` for a subject nobody configured, Confluent's default is BACKWARD (which lets a
   change through that breaks readers still on the old schema);
2. registers the key schema ``"string"`` under ``T-key``, so a catalogue of the registry shows the
   key's type. The key bytes themselves stay plain UTF-8 (schemas/README.md, "Keys");
3. registers the value schema under ``T-value``; a registry that refuses it (incompatible with
   what is registered, or invalid) stops the component with a sentence that says what to do.

Wire sample (Confluent REST API, which Apicurio serves under ``/apis/ccompat/v7``)::

    PUT /config/mail.events-value            {"compatibility": "FULL_TRANSITIVE"}
    POST /subjects/mail.events-value/versions {"schema": "{...}", "schemaType": "AVRO"} -> {"id": 3}
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Callable
from functools import cache, partial
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from connectors.core.avro.errors import RegistryNotAnswering
from connectors.core.avro.registry_bearer import SETTING as BEARER_SETTING
from connectors.core.avro.registry_bearer import (
    bearer_config,
    forget_refused_token,
    token_unavailable,
)
from connectors.core.config import (
    DEFAULT_COMPATIBILITY,
    Compatibility,
    SchemaRegistryClientSettings,
)
from connectors.core.errors import ConfigError, TokenEndpointUnavailable

log = logging.getLogger(__name__)

#: Keys are UTF-8 strings (message identity, command id, instance id).
KEY_SCHEMA = '"string"'

_prepared: set[tuple[str, str, str]] = set()
_lock = threading.Lock()

#: Attempts at one registry call that failed transiently (see `_transient`), with a doubling
#: pause from REGISTRY_RETRY_PAUSE_S: ~6 s in all, enough for a registry busy with the other
#: components' registrations at the same start.
REGISTRY_ATTEMPTS = 5
REGISTRY_RETRY_PAUSE_S = 0.4


def registry_client(url: str, login: SchemaRegistryClientSettings | None = None) -> Any:
    """One client per registry URL, login and process: its schema-id cache is shared by every
    serde. ``login`` (``kafka.schema_registry``): basic auth or a bearer token
    (:mod:`connectors.core.avro.registry_bearer`), the CA, a client certificate.

    Raises ConfigError naming the setting when a file of the login cannot be used (a missing
    CA, a key that does not open): confluent-kafka's client loads them as it is built.
    """
    # No login and an empty one are the same client (one schema-id cache, one mock:// store).
    return _client(url, None if login == SchemaRegistryClientSettings() else login)


def forget_clients() -> None:
    """Forget every cached client (their schema-id caches), as a restart does (tests)."""
    _client.cache_clear()


@cache
def _client(url: str, login: SchemaRegistryClientSettings | None) -> Any:
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "a schema registry is configured but confluent-kafka's registry support is "
            "missing: pip install 'confluent-kafka[avro,schemaregistry]'"
        ) from exc
    try:
        return SchemaRegistryClient.new_client({"url": url, **_login_config(login)})
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(
            f"schema registry {shown(url)}: cannot use the login settings "
            f"(kafka.schema_registry.ssl_*: {_reason(exc)}); check the files and the key's "
            f"password"
        ) from None


def _login_config(login: SchemaRegistryClientSettings | None) -> dict[str, Any]:
    return {**login.client_config(), **bearer_config(login)} if login is not None else {}


def _reason(exc: BaseException) -> str:
    # An OSError's strerror and file name, an SSLError's reason; never the settings' values.
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc.strerror or type(exc).__name__)
    if isinstance(exc, OSError):
        where = f" {exc.filename}" if exc.filename else ""
        return f"{exc.strerror or type(exc).__name__}{where}"
    return str(exc)


def shown(url: str) -> str:
    """``url`` fit for a log line or an error: a ``user:password@`` in it is left out."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


def prepare_subjects(
    url: str,
    topic: str,
    value_schema: str,
    compatibility: Compatibility = DEFAULT_COMPATIBILITY,
    login: SchemaRegistryClientSettings | None = None,
) -> int:
    """Set both subjects' compatibility and register key and value schema; once per process and
    (url, topic, schema). Returns the value schema's id.

    Raises ConfigError with a sentence naming the setting to change when the registry refuses
    the schema, the login (HTTP 401/403) or the TLS handshake, or when no bearer token can be
    had (the token endpoint refuses the client, or does not answer).
    """
    from confluent_kafka.schema_registry import Schema

    # The HTTP library the client itself uses (httpx2 or httpx, confluent-kafka's choice): its
    # TransportError is what a failed TLS handshake or connection raises.
    from confluent_kafka.schema_registry.common._httpx_compat import httpx
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    client = registry_client(url, login)
    schema_id = 0
    with _lock:
        # confluent-kafka's in-memory mock registry (mock://, unit tests) has no /config.
        done = (url, topic, value_schema) in _prepared or url.startswith("mock://")
        for subject, text in ((f"{topic}-key", KEY_SCHEMA), (f"{topic}-value", value_schema)):
            try:
                if not done:
                    _retrying(
                        partial(client.set_compatibility, subject_name=subject, level=compatibility)
                    )
                schema_id = _retrying(
                    partial(client.register_schema, subject, Schema(text, "AVRO"))
                )
            except SchemaRegistryError as exc:
                raise _refused(url, subject, compatibility, exc, login) from None
            except httpx.TransportError as exc:
                raise _unreachable(url, exc) from None
            except TokenEndpointUnavailable as exc:
                assert login is not None and login.bearer_auth is not None  # only it fetches
                raise token_unavailable(login.bearer_auth, exc) from None
        if not done:
            _prepared.add((url, topic, value_schema))
            log.info(
                "registry subjects ready",
                extra={"topic": topic, "compatibility": compatibility, "schema_id": schema_id},
            )
    return int(schema_id)


def _transient(exc: Exception) -> bool:
    """A failure that the same request, repeated, gets past.

    Apicurio 2.4's SQL storage (the local registry, `mailtap.dev.registry`) races when several
    components register at the same time, as they do when they start together: HTTP 500 (H2
    lock timeouts, duplicate keys in its id sequences and in the content table, since the key
    schema ``"string"`` is one content for every ``T-key``), then a 409 "already exists" for
    the subject the failed request half-created, or a 200 without an id (confluent-kafka's
    client then fails on ``int(None)``). The same request alone succeeds. A 5xx from any
    registry (restarting, overloaded) is worth the same few retries, and so is a token endpoint
    that did not answer (the bearer token is fetched inside the registry call).
    """
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    if isinstance(exc, TokenEndpointUnavailable):
        return True
    if isinstance(exc, SchemaRegistryError):
        status = exc.http_status_code or 0
        return status >= 500 or (status == 409 and "already exists" in str(exc.error_message))
    return isinstance(exc, TypeError)


def _retrying(call: Callable[[], Any]) -> Any:
    for attempt in range(1, REGISTRY_ATTEMPTS + 1):
        try:
            return call()
        except Exception as exc:
            if attempt == REGISTRY_ATTEMPTS or not _transient(exc):
                raise
            log.warning(
                "schema registry call failed, retrying",
                extra={"attempt": attempt, "error": str(exc)[:200]},
            )
            time.sleep(REGISTRY_RETRY_PAUSE_S * 2 ** (attempt - 1))
    raise AssertionError("unreachable")


def _unreachable(url: str, exc: Exception) -> ConfigError:
    """A request that got no HTTP answer: the TLS handshake failed, or nothing listens."""
    cause: BaseException = exc
    while cause.__context__ is not None and not isinstance(cause, ssl.SSLError):
        cause = cause.__context__
    if isinstance(cause, ssl.SSLCertVerificationError):
        return ConfigError(
            f"the schema registry at {shown(url)} presented a certificate mailtap does not trust "
            f"({cause.verify_message}): set kafka.schema_registry.ssl_ca_location to the CA "
            f"that signed it"
        )
    if isinstance(cause, ssl.SSLError):
        return ConfigError(
            f"the TLS handshake with the schema registry at {shown(url)} failed "
            f"({cause.reason}): if it asks for a client certificate, set "
            f"kafka.schema_registry.ssl_certificate_location and ssl_key_location"
        )
    return RegistryNotAnswering(
        f"cannot reach the schema registry at {shown(url)} ({type(exc).__name__}: {exc}); "
        f"check kafka.schema_registry_url and that the registry runs"
    )


def _refused(
    url: str,
    subject: str,
    compatibility: str,
    exc: Any,
    login: SchemaRegistryClientSettings | None = None,
) -> ConfigError:
    status = exc.http_status_code
    refusal = login_refused(url, exc, login, f" for {subject}")
    if refusal is not None:
        return refusal
    url = shown(url)
    if status == 409:
        return ConfigError(
            f"the schema registry at {url} refuses the schema for {subject}: it is not "
            f"{compatibility}-compatible with the versions registered there "
            f"({exc.error_message}). If {subject} holds the first released io.mailtap.v1 schema "
            f"(enums without a default symbol), set kafka.schema_compatibility: "
            f"BACKWARD_TRANSITIVE for it; otherwise the subject holds a schema that is not "
            f"mailtap's: use new topic names (kafka.topics.*). See schemas/README.md, "
            f"'Compatibility'"
        )
    if status == 422:
        return ConfigError(
            f"the schema registry at {url} rejects the schema for {subject} as invalid "
            f"({exc.error_message}); this build's schemas/ is broken, not the configuration"
        )
    failed = RegistryNotAnswering if (status or 0) >= 500 else ConfigError
    return failed(
        f"the schema registry at {url} failed for {subject} (HTTP {status}: "
        f"{exc.error_message}); check kafka.schema_registry_url and that the registry runs"
    )


def login_refused(
    url: str, exc: Any, login: SchemaRegistryClientSettings | None, what: str = ""
) -> ConfigError | None:
    """The sentence for a registry answer of HTTP 401/403 (``exc``, a ``SchemaRegistryError``)
    naming the login settings in use, or None for any other answer. ``what`` says what was
    asked (`` for mail.events-value``)."""
    status = getattr(exc, "http_status_code", None)
    if status not in (401, 403):
        return None
    refused = "refused mailtap's login" if status == 401 else "denied mailtap's login access"
    answer = f"HTTP {status}: {exc.error_message}"
    if login is not None and login.bearer_auth is not None:
        if status == 401:  # the token itself was refused (403: it lacks a permission)
            forget_refused_token(login)
        return ConfigError(
            f"the schema registry at {shown(url)} {refused}{what} ({answer}) with a bearer token "
            f"of client {login.bearer_auth.client_id}; check {BEARER_SETTING} (the scope it "
            f"asks for, and that the registry trusts tokens of {login.bearer_auth.token_url}) "
            f"and the registry's permissions"
        )
    return ConfigError(
        f"the schema registry at {shown(url)} {refused}{what} ({answer}); check "
        f"kafka.schema_registry.basic_auth_username and basic_auth_password (or the client "
        f"certificate), and the registry's permissions"
    )
