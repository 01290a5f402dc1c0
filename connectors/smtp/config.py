"""Settings of the SMTP sink: the ``smtp`` section of the YAML file.

Example::

    smtp:
      host: smtp.example.com
      port: 465
      security: tls            # plain | starttls | tls
      username: mailtap@example.com
      password: ${from env MAILTAP__SMTP__PASSWORD}
      from_address: support@example.com
      verp_domain: bounces.example.com
      retry_tiers: [5m, 15m, 1h, 4h]
      max_lifetime: 2d

Sending through Microsoft Graph instead of a relay (``transport: graph``, for Microsoft 365
tenants where SMTP AUTH is disabled; connectors/smtp/README.md, "Sending through Microsoft
Graph")::

    smtp:
      transport: graph
      from_address: support@contoso.com
      pool_size: 4              # Graph allows 4 concurrent requests per app and mailbox
      graph:
        tenant_id: 72f988bf-86f1-41af-91ab-2d7cd011db47
        client_id: 3f1c2b7e-0d4c-4a8e-9d35-5b1f0f3b9e21   # the app of the graph source will do
        client_secret_file: /run/secrets/graph-secret      # or certificate_file
        user: support@contoso.com                          # the mailbox that sends
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from connectors.core.config import NamespacedModel, StrictModel
from connectors.core.entra_settings import EntraAppSettings, require_files
from connectors.core.kafka.topics import DEFAULT_RETRY_TIERS

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: str) -> float:
    """Seconds in a duration such as ``500ms``, ``5m``, ``4h``, ``2d``.

    >>> parse_duration("15m"), parse_duration("1.5s")
    (900.0, 1.5)
    """
    match = _DURATION.match(value.strip())
    if not match:
        raise ValueError(f"{value!r} is not a duration like 30s, 5m, 4h or 2d")
    return float(match.group(1)) * _UNITS[match.group(2)]


class RateLimit(StrictModel):
    """A token bucket: ``per_minute`` messages, bursts up to ``burst`` (default: per_minute/6)."""

    per_minute: float = Field(gt=0, description="sustained messages per minute")
    burst: int | None = Field(default=None, ge=1, description="how many may go at once")


class SuppressionSettings(StrictModel):
    """The suppression list (connectors.smtp.suppression): who is added, what replies carry."""

    enabled: bool = Field(
        default=True,
        description="read the suppression list (kafka.topics.suppressions) and do not send to a "
        "suppressed address (SUPPRESSED event); the bounce reader adds hard bounces, repeated "
        "soft bounces, complaints and unsubscribes",
    )
    hard_bounce_statuses: list[str] = Field(
        default_factory=lambda: ["5.1"],
        description="RFC 3463 status prefixes of a hard bounce that suppresses its recipient "
        "(5.1 = 5.1.x, bad mailbox or domain); other hard bounces only count as soft ones",
    )
    soft_bounce_limit: int = Field(
        default=5,
        ge=0,
        description="this many soft bounces of one address within soft_bounce_window suppress "
        "it (0: never)",
    )
    soft_bounce_window: str = Field(default="7d", description="window of soft_bounce_limit")
    unsubscribe_mailto: str | None = Field(
        default=None,
        description="when set, every reply carries List-Unsubscribe: <mailto:THIS?subject="
        "unsubscribe> (RFC 2369); a mail to this address arriving at a bounce account "
        "suppresses its sender (not automatic mail). Use an address delivered to the bounce "
        "mailbox",
    )
    unsubscribe_url: str | None = Field(
        default=None,
        description="an https URL of an RFC 8058 one-click endpoint run elsewhere (mailtap has "
        "none); when set, replies also carry it and List-Unsubscribe-Post: "
        "List-Unsubscribe=One-Click (RFC 8058 requires an https URI for that header)",
    )

    @field_validator("hard_bounce_statuses")
    @classmethod
    def _status_prefixes(cls, value: list[str]) -> list[str]:
        for prefix in value:
            if not re.fullmatch(r"5(\.\d{1,3}){0,2}", prefix):
                raise ValueError(
                    f"{prefix!r} is not a permanent RFC 3463 status or prefix such as 5.1 or 5.1.1"
                )
        return value

    @field_validator("soft_bounce_window")
    @classmethod
    def _window_is_duration(cls, value: str) -> str:
        parse_duration(value)
        return value

    @field_validator("unsubscribe_mailto")
    @classmethod
    def _mailto_is_address(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[^@\s<>?]+@[A-Za-z0-9.-]+", value):
            raise ValueError(f"{value!r} is not a plain address such as unsubscribe@example.com")
        return value

    @field_validator("unsubscribe_url")
    @classmethod
    def _url_is_https(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https://[^\s<>]+", value):
            raise ValueError(f"{value!r} is not an https:// URL (RFC 8058 one-click needs https)")
        return value

    @property
    def list_unsubscribe(self) -> tuple[str, ...]:
        """The URIs of the List-Unsubscribe header (mailto first), empty when not configured."""
        uris = []
        if self.unsubscribe_mailto:
            uris.append(f"mailto:{self.unsubscribe_mailto}?subject=unsubscribe")
        if self.unsubscribe_url:
            uris.append(self.unsubscribe_url)
        return tuple(uris)

    @property
    def soft_bounce_window_seconds(self) -> float:
        return parse_duration(self.soft_bounce_window)


#: Graph allows 4 concurrent requests per application per mailbox ("Outlook service limits",
#: learn.microsoft.com/graph/throttling-limits); more are answered 429.
GRAPH_CONCURRENCY_LIMIT = 4


class GraphSendSettings(EntraAppSettings):
    """``smtp.graph``: the Microsoft Entra application and the mailbox that sends.

    The same app registration as the Graph source's (``graph.tenant_id``, ``client_id``, its
    secret or certificate; one model, :class:`~connectors.core.entra_settings.EntraAppSettings`)
    with the application permission ``Mail.Send`` granted; app-only (client credentials), as a
    sink runs unattended.
    """

    user: str = Field(
        min_length=1,
        description="user id or userPrincipalName of the mailbox that sends "
        "(POST /users/{user}/sendMail); the From of a reply must be this mailbox or one it "
        "may send as, and its NDRs arrive in its inbox",
    )
    save_to_sent_items: bool = Field(
        default=True, description="keep a copy of every reply in the mailbox's Sent Items"
    )
    request_timeout: float = Field(
        default=120.0,
        gt=0,
        description="waiting for Graph's answer to a sendMail; past it the outcome is UNKNOWN "
        "and the mail is resent with the same Message-ID",
    )

    @model_validator(mode="after")
    def _one_credential(self) -> GraphSendSettings:
        given = [
            name
            for name, value in (
                ("client_secret", self.client_secret),
                ("client_secret_file", self.client_secret_file),
                ("certificate_file", self.certificate_file),
            )
            if value is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "set exactly one of client_secret, client_secret_file or certificate_file "
                f"(the application's credential); got {given or 'none'}"
            )
        require_files((self.client_secret_file, self.certificate_file))
        return self


class SmtpSinkSettings(NamespacedModel):
    """Everything the sink needs besides Kafka (which comes from the ``kafka`` section)."""

    NAMESPACED = ("group_id", "bounce_group_id", "state_topic")

    transport: Literal["smtp", "graph"] = Field(
        default="smtp",
        description="smtp = a relay (host, port, security...); graph = Microsoft Graph's "
        "sendMail with the smtp.graph application, for tenants where SMTP AUTH is disabled",
    )
    graph: GraphSendSettings | None = Field(
        default=None, description="transport graph: the application and the sending mailbox"
    )
    host: str = Field(
        default="",
        description="relay host name; also the name checked in its certificate (transport smtp)",
    )
    port: int = Field(
        default=587, ge=1, le=65535, description="relay port (465 for tls, 587 or 25)"
    )
    security: Literal["plain", "starttls", "tls"] = Field(
        default="starttls",
        description="tls = implicit TLS (465); starttls must succeed (no fallback); plain only "
        "for a relay on the loopback or in a trusted network",
    )
    ca_file: str | None = Field(default=None, description="CA bundle; the system store when unset")
    username: str | None = Field(default=None, description="AUTH user; no AUTH when unset")
    password: SecretStr | None = Field(default=None, description="AUTH password (never logged)")
    oauth2_token: SecretStr | None = Field(
        default=None, description="XOAUTH2 bearer token (with username); replaces the password"
    )
    auth_mechanism: Literal["auto", "PLAIN", "LOGIN", "XOAUTH2"] = Field(
        default="auto",
        description="auto = XOAUTH2 with oauth2_token, else the best the relay offers",
    )
    local_hostname: str | None = Field(default=None, description="EHLO name; the FQDN when unset")
    from_address: str = Field(
        description="envelope sender (MAIL FROM, where bounces go) when verp_domain is unset; "
        "the From header comes from each command"
    )
    instance_id: str | None = Field(
        default=None,
        description="stable name of this sink instance (default: host name); it names the "
        "transactional ids (<group_id>.<instance_id>, and <group_id>.<instance_id>#1 for the "
        "second commit lane) and is the static group member id, so a restarted instance fences "
        "and aborts what its "
        "predecessor left open and gets its partitions back at once. Each replica needs its own "
        "(a StatefulSet's pod names are stable ones)",
    )
    verp_domain: str | None = Field(
        default=None,
        description="when set, the envelope sender is bounce+<command token>@verp_domain",
    )
    group_id: str = Field(default="mailtap-smtp-sink", description="Kafka consumer group")
    bounce_accounts: list[str] = Field(
        default_factory=list,
        description="MailEvent accounts that are bounce mailboxes; when set, the sink process "
        "also runs the bounce reader (mail.events -> BOUNCED delivery events)",
    )
    bounce_group_id: str = Field(default="mailtap-bounce-reader", description="its consumer group")
    state_topic: str = Field(
        default="mailtap.sink.state",
        description="compacted topic of per-command intent/outcome, as many partitions as "
        "mail.commands; an instance reads back the partitions it is assigned",
    )
    state_retention: str = Field(
        default="30d",
        description="a DONE command state older than this becomes a tombstone on state_topic; "
        "a command created longer ago than this (a replay) is not sent but answered FAILED. "
        "Longer than max_lifetime",
    )
    retry_tiers: list[str] = Field(
        default_factory=lambda: list(DEFAULT_RETRY_TIERS),
        min_length=1,
        description="delays of the retry topics (retry_prefix.TIER), increasing; attempt n+1 "
        "waits tier n, the last tier repeats",
    )
    max_lifetime: str = Field(
        default="2d", description="after this age (since created_at) a deferred command is FAILED"
    )
    max_attempts: int = Field(default=10, ge=1, description="attempts before FAILED + DLQ")
    pool_size: int = Field(
        default=4,
        ge=1,
        le=100,
        description="connections (= concurrency); also the most mails a crash can leave UNKNOWN "
        "(and resent)",
    )
    rate: RateLimit | None = Field(default=None, description="relay-wide message rate")
    domain_rates: dict[str, RateLimit] = Field(
        default_factory=dict, description="per recipient domain; key '*' applies to every domain"
    )
    max_rate_wait: float = Field(
        default=10.0,
        ge=0,
        description="a message that would still wait for the rate limit this many seconds "
        "after its batch began is DEFERRED to a retry tier instead, so a throttled domain does "
        "not hold the whole batch",
    )
    connect_timeout: float = Field(
        default=30.0, gt=0, description="TCP + TLS + greeting; RFC 5321 4.5.3.2 allows 5 min"
    )
    command_timeout: float = Field(
        default=60.0, gt=0, description="per SMTP command (RFC 5321 suggests 5 min for MAIL/RCPT)"
    )
    data_timeout: float = Field(
        default=120.0,
        gt=0,
        description="waiting for the reply to the final '.'; RFC 5321 4.5.3.2.6 suggests 10 min. "
        "Past it the outcome is UNKNOWN and the mail is resent with the same Message-ID",
    )
    batch_size: int = Field(
        default=200,
        ge=1,
        description="commands consumed at once; each outcome is recorded as its reply comes in, "
        "the batch's offsets once all are",
    )
    max_message_bytes: int = Field(
        default=25_000_000, ge=1000, description="larger rendered messages are FAILED unsent"
    )
    suppression: SuppressionSettings = Field(
        default_factory=SuppressionSettings,
        description="the suppression list: see its keys",
    )

    @field_validator("retry_tiers")
    @classmethod
    def _tiers_are_durations(cls, value: list[str]) -> list[str]:
        delays = [parse_duration(v) for v in value]
        if delays != sorted(delays):
            raise ValueError("retry tiers must be in increasing order")
        return value

    @field_validator("max_lifetime", "state_retention")
    @classmethod
    def _lifetime_is_duration(cls, value: str) -> str:
        parse_duration(value)
        return value

    @model_validator(mode="after")
    def _transport_is_complete(self) -> SmtpSinkSettings:
        if self.transport == "smtp":
            if not self.host:
                raise ValueError("host is required with transport smtp (the relay's name)")
            if self.graph is not None:
                raise ValueError("graph applies to transport graph only; set transport: graph")
            return self
        if self.graph is None:
            raise ValueError(
                "transport graph needs the graph block (tenant_id, client_id, a secret or "
                "certificate, user: the sending mailbox)"
            )
        if self.verp_domain:
            raise ValueError(
                "verp_domain does not apply to transport graph: Exchange Online sets the "
                "return path to the sending mailbox, so bounces arrive there as NDRs; remove "
                "verp_domain and list that mailbox's account in bounce_accounts"
            )
        if self.pool_size > GRAPH_CONCURRENCY_LIMIT:
            raise ValueError(
                f"pool_size {self.pool_size} exceeds Graph's {GRAPH_CONCURRENCY_LIMIT} concurrent "
                f"requests per application and mailbox (more are answered 429); set pool_size "
                f"to {GRAPH_CONCURRENCY_LIMIT} or less"
            )
        return self

    @model_validator(mode="after")
    def _auth_is_complete(self) -> SmtpSinkSettings:
        if (self.password or self.oauth2_token) and not self.username:
            raise ValueError("username is required with password or oauth2_token")
        if self.auth_mechanism == "XOAUTH2" and not self.oauth2_token:
            raise ValueError("auth_mechanism XOAUTH2 needs oauth2_token")
        first_tier = self.tier_delays[0]
        if first_tier[1] >= self.max_lifetime_seconds:
            raise ValueError(
                f"max_lifetime {self.max_lifetime} is not longer than the first retry tier "
                f"{first_tier[0]}: nothing would ever be retried; raise max_lifetime"
            )
        if self.state_retention_seconds <= self.max_lifetime_seconds:
            raise ValueError(
                f"state_retention {self.state_retention} must be longer than max_lifetime "
                f"{self.max_lifetime}: a command still being retried would be refused as too old; "
                f"raise state_retention"
            )
        return self

    @property
    def tier_delays(self) -> list[tuple[str, float]]:
        """``[(tier name, delay seconds)]`` in order."""
        return [(t, parse_duration(t)) for t in self.retry_tiers]

    @property
    def max_lifetime_seconds(self) -> float:
        return parse_duration(self.max_lifetime)

    @property
    def state_retention_seconds(self) -> float:
        return parse_duration(self.state_retention)
