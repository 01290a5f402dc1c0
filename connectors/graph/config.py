"""Settings of the Microsoft Graph source: section ``graph`` of the mailtap YAML file.

Example::

    graph:
      tenant_id: 72f988bf-86f1-41af-91ab-2d7cd011db47
      client_id: 3f1c2b7e-0d4c-4a8e-9d35-5b1f0f3b9e21
      auth: client_secret            # client_secret | client_certificate | refresh_token
      client_secret_file: /run/secrets/graph-secret
      accounts:
        - name: support
          user: support@contoso.com  # user id or userPrincipalName
          folders: [inbox, archive]  # well-known folder names or folder ids
          start: latest              # all | latest | since:2026-01-01
      sweep_interval_seconds: 60     # a delta round at least this often, notifications or not

Secrets (``client_secret``, the certificate's key, ``refresh_token``) come from the YAML, from a
``*_file`` (read at start; mount a Kubernetes secret there), or from the environment
(``MAILTAP__GRAPH__CLIENT_SECRET``); they are ``SecretStr`` and never logged. The endpoints are
Microsoft's public cloud by default; ``authority_host`` and ``api_base`` point elsewhere (a
national cloud, or the test server on loopback: plain ``http://`` is accepted there only).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from connectors.core.config import KafkaSettings, StrictModel
from connectors.core.entra_settings import EntraAppSettings, read_secret, require_files
from connectors.core.source.settings import (
    START_DESCRIPTION,
    SourceSettings,
    start_since,
    validate_start,
)

SECTION = "graph"

#: Graph allows 4 concurrent requests per application per mailbox ("Outlook service limits",
#: learn.microsoft.com/graph/throttling-limits); more are answered 429.
GRAPH_CONCURRENCY_LIMIT = 4


class GraphAccountSettings(StrictModel):
    """One mailbox; each folder gets its own worker and delta cursor, the folders of a mailbox
    share its request limit."""

    name: str = Field(min_length=1, description="account name in keys, offsets and metrics")
    user: str = Field(min_length=1, description="the mailbox's user id or userPrincipalName")
    folders: tuple[str, ...] = Field(
        default=("inbox",), description="well-known folder names (inbox, archive, ...) or ids"
    )
    start: str = Field(default="latest", description=START_DESCRIPTION)

    @field_validator("start")
    @classmethod
    def _start(cls, value: str) -> str:
        return validate_start(value)

    @field_validator("folders")
    @classmethod
    def _folders(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value or len({v.lower() for v in value}) != len(value):
            raise ValueError("list at least one folder, each once")
        return value

    @property
    def start_since(self) -> dt.date | None:
        return start_since(self.start)


class NotificationSettings(StrictModel):
    """How change notifications reach the source. They only wake a delta round up; the
    periodic sweep runs anyway, so a lost notification delays mail by one sweep at most.

    ``webhook``: the source listens on ``listen_host:listen_port`` (HTTPS with
    ``certificate_file`` + ``key_file``, or plain HTTP behind an ingress that terminates TLS)
    and subscribes every folder with ``public_url`` + ``/notify`` (and ``/lifecycle``), the
    address Graph reaches it at (https, as Graph requires).

    ``eventhubs``: every folder is subscribed with ``event_hub_url``
    (``EventHub:https://<namespace>.servicebus.windows.net/eventhubname/<hub>?tenantId=<domain>``)
    and the source reads the hub through the Kafka protocol, connecting with ``event_hubs``
    (a ``kafka``-like block: ``bootstrap_servers: <namespace>.servicebus.windows.net:9093``,
    SASL_SSL PLAIN with user ``$ConnectionString``).
    """

    mode: Literal["none", "webhook", "eventhubs"] = Field(
        default="none", description="none (delta polling only) | webhook | eventhubs"
    )
    public_url: str | None = Field(
        default=None, description="webhook: the https:// base URL Graph posts notifications to"
    )
    listen_host: str = Field(default="0.0.0.0", description="webhook: the listener's address")
    listen_port: int = Field(default=8443, ge=0, le=65535, description="webhook: its port (0: any)")
    certificate_file: Path | None = Field(
        default=None, description="webhook: PEM certificate chain (HTTPS); unset: plain HTTP"
    )
    key_file: Path | None = Field(default=None, description="webhook: PEM private key")
    client_state: SecretStr | None = Field(
        default=None,
        description="webhook: the secret Graph echoes in every notification (at most 128 "
        "characters); notifications without it are ignored",
    )
    event_hub_url: str | None = Field(
        default=None, description="eventhubs: the EventHub:https://... notificationUrl"
    )
    event_hubs: KafkaSettings | None = Field(
        default=None, description="eventhubs: the namespace's Kafka endpoint and credentials"
    )
    #: Outlook message subscriptions live at most 10,080 minutes (subscription resource type);
    #: renewed at half their life, so a renewal that fails has days to succeed.
    subscription_minutes: int = Field(
        default=4_320, ge=5, le=10_080, description="webhook: subscription lifetime"
    )

    @model_validator(mode="after")
    def _complete(self) -> NotificationSettings:
        if self.mode == "none":
            return self
        secret = self.client_state.get_secret_value() if self.client_state else ""
        if not 8 <= len(secret) <= 128:
            raise ValueError(
                f"notifications mode {self.mode} needs a client_state of 8-128 characters"
            )
        if self.mode == "eventhubs":
            if self.event_hubs is None or self.event_hub_name is None:
                raise ValueError(
                    "notifications mode eventhubs needs event_hubs (the namespace's Kafka "
                    "endpoint) and event_hub_url: EventHub:https://<namespace>.servicebus."
                    "windows.net/eventhubname/<hub>?tenantId=<domain>"
                )
            return self
        if not self.public_url or not self.public_url.startswith("https://"):
            raise ValueError("notifications mode webhook needs public_url: https://...")
        if (self.certificate_file is None) != (self.key_file is None):
            raise ValueError("set both certificate_file and key_file for HTTPS, or neither")
        return self

    @property
    def event_hub_name(self) -> str | None:
        """The hub (the Kafka topic) of ``event_hub_url``."""
        url = self.event_hub_url or ""
        if not url.startswith("EventHub:https://"):
            return None
        segments = urlsplit(url.removeprefix("EventHub:")).path.strip("/").split("/")
        return segments[1] if len(segments) == 2 and segments[0] == "eventhubname" else None

    def notification_urls(self) -> tuple[str, str]:
        """(notificationUrl, lifecycleNotificationUrl) of a subscription."""
        if self.mode == "eventhubs":
            assert self.event_hub_url is not None
            return self.event_hub_url, self.event_hub_url
        assert self.public_url is not None
        base = self.public_url.rstrip("/")
        return f"{base}/notify", f"{base}/lifecycle"


class GraphSourceSettings(SourceSettings, EntraAppSettings):
    """The whole ``graph`` section."""

    ACCOUNTS_KEY = "graph.accounts"
    SOURCE_KIND = "graph"

    auth: Literal["client_secret", "client_certificate", "refresh_token"] = Field(
        default="client_secret",
        description="app-only with a secret (client_secret or client_secret_file) or a "
        "certificate (certificate_file), or delegated with a refresh token",
    )
    refresh_token: SecretStr | None = Field(
        default=None,
        description="auth: refresh_token (delegated; a confidential client also "
        "needs client_secret)",
    )
    refresh_token_file: Path | None = Field(
        default=None, description="file holding the refresh token (instead of refresh_token)"
    )
    # Not Field(min_length=1): pydantic would echo the accounts in the error; checked below.
    accounts: tuple[GraphAccountSettings, ...] = Field(
        description="mailboxes to watch; each gets one worker thread per folder"
    )
    batch_size: int = Field(
        default=50,
        ge=1,
        le=1000,
        description="messages per delta page (Prefer: odata.maxpagesize) and per transaction",
    )
    #: The safety net under the notifications, and the only wake-up with ``mode: none``. A
    #: delta round that finds nothing costs one request per folder.
    sweep_interval_seconds: float = Field(
        default=60.0, gt=0, description="a delta round at least this often per folder"
    )
    request_timeout_seconds: float = Field(
        default=60.0, gt=0, description="timeout of each Graph request"
    )
    max_concurrent_requests: int = Field(
        default=GRAPH_CONCURRENCY_LIMIT,
        ge=1,
        le=GRAPH_CONCURRENCY_LIMIT,
        description="requests in flight per mailbox (Graph allows 4 per app and mailbox)",
    )
    #: A throttled (429) or busy (503/504) answer is retried after its Retry-After this many
    #: times before the round fails and the worker backs off.
    max_retries: int = Field(default=6, ge=0, le=50, description="retries of a throttled call")
    notifications: NotificationSettings = Field(
        default=NotificationSettings(), description="change notifications (wake-ups only)"
    )

    @model_validator(mode="after")
    def _credentials(self) -> GraphSourceSettings:
        if self.client_secret is not None and self.client_secret_file is not None:
            raise ValueError("set client_secret or client_secret_file, not both")
        if self.refresh_token is not None and self.refresh_token_file is not None:
            raise ValueError("set refresh_token or refresh_token_file, not both")
        has_secret = self.client_secret is not None or self.client_secret_file is not None
        require_files((self.client_secret_file, self.certificate_file, self.refresh_token_file))
        if self.auth == "client_secret" and not has_secret:
            raise ValueError("auth client_secret needs client_secret or client_secret_file")
        if self.auth == "client_certificate":
            if self.certificate_file is None:
                raise ValueError("auth client_certificate needs certificate_file (PEM)")
            if has_secret:
                raise ValueError("auth client_certificate takes no client_secret")
        if self.auth == "refresh_token" and (
            self.refresh_token is None and self.refresh_token_file is None
        ):
            raise ValueError("auth refresh_token needs refresh_token or refresh_token_file")
        if self.auth != "refresh_token" and (
            self.refresh_token is not None or self.refresh_token_file is not None
        ):
            raise ValueError(f"refresh_token does not apply to auth {self.auth}")
        return self

    def refresh(self) -> str | None:
        """The refresh token, from the YAML/env or its file."""
        return read_secret(self.refresh_token, self.refresh_token_file)
