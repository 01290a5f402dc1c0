"""Settings of the Exchange (EWS) source: section ``ews`` of the mailtap YAML file.

Example::

    ews:
      accounts:
        - name: support
          service_endpoint: https://mail.example.com/EWS/Exchange.asmx
          email: support@example.com
          auth: ntlm                   # ntlm | basic | oauth2
          username: EXAMPLE\\support    # ntlm/basic; defaults to email
          password: "..."
          folders: [inbox]             # distinguished folder names
          start: latest                # all | latest | since:2026-01-01
      connection_timeout_minutes: 10

OAuth2 takes either a bearer token obtained elsewhere (``oauth2_access_token``) or the Azure AD
client-credentials triple (``oauth2_client_id``, ``oauth2_client_secret``, ``oauth2_tenant_id``).
TLS certificate verification is always on; ``ca_file`` adds a private CA. Plain ``http://`` is
accepted only for a loopback endpoint (tests).
"""

from __future__ import annotations

import datetime as dt
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from connectors.core.config import StrictModel
from connectors.core.entra_settings import is_loopback
from connectors.core.source.settings import (
    START_DESCRIPTION,
    SourceSettings,
    start_since,
    validate_start,
)

SECTION = "ews"

#: exchangelib's own distinguished folder names for mail folders we can watch.
MAIL_FOLDERS = frozenset({"inbox", "junkemail", "sentitems", "deleteditems", "drafts"})


class EwsAccountSettings(StrictModel):
    """One Exchange mailbox; each folder gets its own worker, subscription and cursor."""

    name: str = Field(min_length=1, description="account name in keys, offsets and metrics")
    service_endpoint: str = Field(
        description="https://<server>/EWS/Exchange.asmx (no autodiscover)"
    )
    email: str = Field(min_length=3, description="primary SMTP address of the mailbox")
    auth: Literal["ntlm", "basic", "oauth2"] = Field(
        default="ntlm", description="ntlm/basic for Exchange Server on-premises, or oauth2"
    )
    username: str | None = Field(
        default=None, description="DOMAIN\\user or UPN for ntlm/basic; the email when unset"
    )
    password: SecretStr | None = Field(default=None, description="auth: ntlm or basic")
    oauth2_access_token: SecretStr | None = Field(
        default=None, description="bearer token obtained elsewhere (auth: oauth2)"
    )
    oauth2_client_id: str | None = Field(
        default=None, description="client credentials flow (with secret and tenant id)"
    )
    oauth2_client_secret: SecretStr | None = Field(
        default=None, description="OAuth2 client-credentials secret (never logged)"
    )
    oauth2_tenant_id: str | None = Field(
        default=None, description="Azure AD tenant of the OAuth2 application"
    )
    ca_file: str | None = Field(default=None, description="CA bundle; the system store if unset")
    folders: tuple[str, ...] = Field(
        default=("inbox",),
        description=f"distinguished folder names: {', '.join(sorted(MAIL_FOLDERS))}",
    )
    start: str = Field(
        default="latest",
        description=START_DESCRIPTION,
    )

    @field_validator("service_endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme == "https" and parts.hostname:
            return value
        if parts.scheme == "http" and parts.hostname and is_loopback(parts.hostname):
            return value
        raise ValueError("expected https://<server>/EWS/Exchange.asmx (http only on loopback)")

    @field_validator("email")
    @classmethod
    def _email(cls, value: str) -> str:
        if "@" not in value:
            raise ValueError("expected the mailbox's primary SMTP address")
        return value

    @field_validator("start")
    @classmethod
    def _start(cls, value: str) -> str:
        return validate_start(value)

    @field_validator("folders")
    @classmethod
    def _folders(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value or len(set(value)) != len(value):
            raise ValueError("list at least one folder, each once")
        unknown = sorted(set(value) - MAIL_FOLDERS)
        if unknown:
            raise ValueError(
                f"unknown folder(s) {unknown}; expected some of {sorted(MAIL_FOLDERS)}"
            )
        return value

    @model_validator(mode="after")
    def _credentials(self) -> EwsAccountSettings:
        client_triple = (self.oauth2_client_id, self.oauth2_client_secret, self.oauth2_tenant_id)
        if self.auth in ("ntlm", "basic"):
            if self.password is None:
                raise ValueError(f"auth {self.auth} needs a password")
            if self.oauth2_access_token is not None or any(v is not None for v in client_triple):
                raise ValueError(f"oauth2_* settings do not apply to auth {self.auth}")
            return self
        has_token = self.oauth2_access_token is not None
        has_client = all(v is not None for v in client_triple)
        if has_token == has_client or (
            not has_client and any(v is not None for v in client_triple)
        ):
            raise ValueError(
                "auth oauth2 needs exactly one of oauth2_access_token or "
                "oauth2_client_id + oauth2_client_secret + oauth2_tenant_id"
            )
        if self.password is not None:
            raise ValueError("password does not apply to auth oauth2")
        if not self.service_endpoint.startswith("https://"):
            raise ValueError(
                "auth oauth2 needs an https:// service_endpoint (RFC 6749 section 3.1)"
            )
        return self

    @property
    def login(self) -> str:
        return self.username or self.email

    @property
    def start_since(self) -> dt.date | None:
        return start_since(self.start)


class EwsSourceSettings(SourceSettings):
    """The whole ``ews`` section."""

    ACCOUNTS_KEY = "accounts"
    SOURCE_KIND = "ews"

    # Not Field(min_length=1): pydantic would then echo the whole accounts list, passwords
    # included, in the error of an invalid account; the emptiness check is below.
    accounts: tuple[EwsAccountSettings, ...] = Field(
        description="mailboxes to watch; each gets one worker thread per folder"
    )
    batch_size: int = Field(
        default=100, ge=1, le=1000, description="items per GetItem and per Kafka transaction"
    )
    #: GetStreamingEvents ``ConnectionTimeout`` (EWS allows 1-30 minutes). The server ends the
    #: stream with ConnectionStatus=Closed after it and we reconnect to the same subscription; a
    #: clean Closed also marks the mailbox healthy, so keep it below health.max_sync_age_seconds.
    connection_timeout_minutes: int = Field(
        default=5, ge=1, le=30, description="GetStreamingEvents ConnectionTimeout (1-30)"
    )
    #: A read on the stream blocks at most this long. Exchange writes a keep-alive on an idle
    #: stream, so silence longer than this is a stalled or half-open connection. exchangelib's own
    #: read timeout would be ConnectionTimeout + 1 minute.
    stream_read_timeout_seconds: float = Field(
        default=120.0, gt=0, description="silence on the stream longer than this = stalled"
    )
    #: Timeout of every other request (GetFolder, Subscribe, GetItem, FindItem).
    request_timeout_seconds: float = Field(
        default=60.0, gt=0, description="GetFolder, Subscribe, GetItem, FindItem"
    )
    #: After an expired subscription, a dropped stream or a restart, FindItem catches up from the
    #: stored watermark minus this margin: DateTimeReceived has whole-second precision and is
    #: stamped by the mailbox server, and events of one second may arrive in any order. Items
    #: already committed inside the margin are remembered in the cursor and not emitted twice.
    catchup_margin_seconds: float = Field(
        default=300.0, ge=0, description="FindItem catch-up starts this long before the watermark"
    )
    #: The stream holds one HTTP connection for its whole duration; GetItem/FindItem need another
    #: (with exchangelib's default of one, get() inside the stream loop hangs: #906, #1088).
    max_connections: int = Field(
        default=4, ge=2, le=16, description="HTTP connections per mailbox (the stream holds one)"
    )
