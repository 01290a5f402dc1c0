"""Settings of the IMAP source: section ``imap`` of the mailtap YAML file.

Example::

    imap:
      accounts:
        - name: support
          host: imap.example.com
          security: ssl                # ssl (993) | starttls (143) | plain (loopback tests only)
          username: support@example.com
          password: "..."             # or oauth2_access_token: "..." (XOAUTH2),
                                       # or oauth2_access_token_file: /run/secrets/imap-token
          folders: [INBOX]
          start: latest                # all | latest | since:2026-01-01
          after_commit: move:Processed # none | seen | move:<folder>
      batch_size: 200

Every timeout has a reason written next to it; a misconfiguration fails at start with the key path.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from connectors.core.config import ClientCredentialsSettings, StrictModel
from connectors.core.source.settings import (
    START_DESCRIPTION,
    SourceSettings,
    start_since,
    validate_start,
)

SECTION = "imap"


class ImapAccountSettings(StrictModel):
    """One mailbox account; each folder gets its own worker, connection and cursor."""

    name: str = Field(min_length=1, description="account name in keys, offsets and metrics")
    host: str = Field(min_length=1, description="IMAP server host name")
    port: int | None = Field(default=None, ge=1, le=65535, description="993 for ssl, else 143")
    security: Literal["plain", "ssl", "starttls"] = Field(
        default="ssl", description="ssl or starttls verify certificates; plain for loopback tests"
    )
    username: str = Field(min_length=1, description="login name")
    password: SecretStr | None = Field(default=None, description="LOGIN password")
    oauth2_access_token: SecretStr | None = Field(
        default=None, description="XOAUTH2 bearer token, used instead of a password"
    )
    oauth2_access_token_file: Path | None = Field(
        default=None,
        description=(
            "file holding the XOAUTH2 bearer token, read again at every login: a token "
            "refresher (a sidecar, a cron job) rewrites it before the token expires"
        ),
    )
    oauth2: ClientCredentialsSettings | None = Field(
        default=None,
        description="XOAUTH2 with tokens mailtap fetches itself (OAuth2 client credentials: "
        "token_url, client_id, client_secret, scope)",
    )
    ca_file: str | None = Field(default=None, description="CA bundle; the system store if unset")
    folders: tuple[str, ...] = Field(default=("INBOX",), description="folders to publish")
    start: str = Field(
        default="latest",
        description=START_DESCRIPTION,
    )
    mode: Literal["idle", "poll"] = Field(
        default="idle", description="idle (push, with catch-up polls) or poll only"
    )
    after_commit: str = Field(
        default="none", description="side effect after commit: none | seen | move:<folder>"
    )

    @field_validator("start")
    @classmethod
    def _start(cls, value: str) -> str:
        return validate_start(value)

    @field_validator("after_commit")
    @classmethod
    def _after_commit(cls, value: str) -> str:
        if value in ("none", "seen") or (value.startswith("move:") and value[5:].strip()):
            return value
        raise ValueError("expected none, seen or move:<folder>")

    @field_validator("folders")
    @classmethod
    def _folders(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value or len(set(value)) != len(value):
            raise ValueError("list at least one folder, each once")
        return value

    @model_validator(mode="after")
    def _credentials(self) -> ImapAccountSettings:
        given = [
            self.password is not None,
            self.oauth2_access_token is not None,
            self.oauth2_access_token_file is not None,
            self.oauth2 is not None,
        ]
        if sum(given) != 1:
            raise ValueError(
                "set exactly one of password, oauth2_access_token, oauth2_access_token_file "
                "or oauth2"
            )
        token_file = self.oauth2_access_token_file
        if token_file is not None and not token_file.is_file():
            raise ValueError(
                f"oauth2_access_token_file {token_file} does not exist; write the token there "
                f"before starting, or use oauth2_access_token"
            )
        if self.move_target is not None and self.move_target in self.folders:
            raise ValueError("after_commit move target must not be a watched folder")
        return self

    @property
    def effective_port(self) -> int:
        if self.port is not None:
            return self.port
        return 993 if self.security == "ssl" else 143

    @property
    def start_since(self) -> dt.date | None:
        return start_since(self.start)

    @property
    def move_target(self) -> str | None:
        return self.after_commit[5:].strip() if self.after_commit.startswith("move:") else None


class ImapSourceSettings(SourceSettings):
    """The whole ``imap`` section."""

    ACCOUNTS_KEY = "imap.accounts"
    SOURCE_KIND = "imap"

    # Non-empty is checked in _unique_names: a min_length here makes pydantic add a second error
    # whose "input" is the whole account list, and the core's message would quote the passwords.
    accounts: tuple[ImapAccountSettings, ...] = Field(
        description="mailbox accounts; each folder of each gets its own worker"
    )
    batch_size: int = Field(
        default=200, ge=1, le=5000, description="mails per fetch and per Kafka transaction"
    )
    connect_timeout_seconds: float = Field(
        default=15.0, gt=0, description="TCP connect + TLS handshake"
    )
    #: A read blocks at most this long. It bounds how long a silent (half-open) connection goes
    #: unnoticed outside IDLE, and must exceed the slowest legitimate FETCH of one batch.
    read_timeout_seconds: float = Field(
        default=60.0, gt=0, description="longest wait for any server answer (silent peers)"
    )
    #: RFC 2177: servers may drop an IDLE after 30 min of inactivity; imapclient's docs advise
    #: renewing every ~10 min. A renew (DONE + a new IDLE) also proves the connection is alive.
    idle_renew_seconds: float = Field(
        default=540.0, gt=0, le=1500, description="IDLE is ended and restarted at this interval"
    )
    #: Dovecot tells an IDLE session neither a UIDVALIDITY change nor a deleted folder (it
    #: answers the session's next command with BYE). IDLE is ended this often for a NOOP and a
    #: STATUS (two round trips), which bounds how late such a change is noticed.
    uidvalidity_check_seconds: float = Field(
        default=10.0,
        gt=0,
        le=1500,
        description="IDLE is interrupted this often to notice a UIDVALIDITY change or a deleted folder",
    )
    #: A dropped IDLE notification must not delay mail forever: a full re-sync (new mail, flag
    #: changes, expunges) at this interval even when IDLE says nothing happened.
    catchup_poll_seconds: float = Field(
        default=300.0, gt=0, description="full re-sync (incl. expunges) at least this often"
    )
    poll_interval_seconds: float = Field(default=30.0, gt=0, description="mode: poll")
    #: RFC 7162 QRESYNC: a reconnect asks SELECT what vanished since the cursor instead of
    #: listing every UID of the folder. ``off`` always lists (servers whose QRESYNC is broken).
    qresync: Literal["auto", "off"] = Field(
        default="auto",
        description="auto: use QRESYNC on reconnect where the server offers it; off: list the folder",
    )
    #: Claim-check blobs are fsynced on this many threads (shared by all mailboxes) while the
    #: parser goes on; a batch's blobs are durable before its transaction commits.
    claim_check_threads: int = Field(
        default=8, ge=1, le=64, description="threads writing claim-check blobs ahead of parsing"
    )
    #: A backfill (more new mails than one batch) is parsed in this many processes while the
    #: mailbox thread fetches and the previous batch commits; 0 parses in the mailbox thread.
    parse_workers: int = Field(
        default=2, ge=0, le=64, description="processes parsing mails during a backfill (0: none)"
    )
    #: Mails fetched per round trip are also capped by size, so memory stays flat with big mails.
    max_batch_bytes: int = Field(
        default=32 * 1024 * 1024, gt=0, description="bytes of mail per FETCH round trip"
    )

    @model_validator(mode="before")
    @classmethod
    def _no_own_dlq(cls, data: Any) -> Any:
        # One DLQ for every component: a topic only the IMAP source wrote to was invisible to
        # `mailtap dlq` and `mailtap status`, and the EWS source never honoured it.
        if isinstance(data, dict) and data.get("dlq_topic") is not None:
            raise ValueError(
                "imap.dlq_topic is no longer read: set kafka.topics.dlq instead (the DLQ of "
                "both sources, the sink, `mailtap dlq` and `mailtap status`)"
            )
        if isinstance(data, dict) and "dlq_topic" in data:
            data = {k: v for k, v in data.items() if k != "dlq_topic"}
        return data
