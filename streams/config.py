"""Settings of the streams worker: the ``streams`` section of the mailtap YAML.

Example (the rules are tried in order, the first match picks the workflow)::

    streams:
      app_id: mailtap-streams
      from_address: {name: Helpdesk, address: helpdesk@example.com}
      require: trusted-ar              # none | trusted-ar | dkim-aligned | dmarc-pass; per workflow below
      authserv_id: mx.example.com      # whose Authentication-Results we trust (trusted-ar)
      auth:                            # our own checks (dkim-aligned, dmarc-pass)
        trusted_received_by: mx.example.com   # our border MTA: SPF uses the IP it recorded
        nameserver: 127.0.0.1:53              # default: the system resolver
        trusted_arc_sealers: [lists.example.org]
      rate_limit: {max_replies: 5, window_seconds: 3600, exempt_recipients: [boss@example.com]}
      reply_to_allow: ["*@tickets.partner.example"]   # Reply-To honoured outside the From domain
      rules:
        - name: expenses
          match: {recipient: approvals@example.com, has_attachment: true}
          workflow: approval
        - match: {recipient: "*@support.example.com", subject: "(?i)help|broken"}
          workflow: ticket_intake
      workflows:
        approval:
          options: {approver: boss@example.com, approver_dkim_domains: [example.com]}
        ticket_intake:
          require: none

Validated at start-up (:func:`streams.workflow.bind_workflows`): a rule naming an unknown
workflow or workflow options of the wrong shape stop the worker with the key path to fix.

``require`` was called ``auth_policy`` (values ``authserv`` and ``dkim``) before; both the old
key and the old values are still read, as ``trusted-ar`` and ``dkim-aligned``.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from connectors.core.config import NamespacedModel, StrictModel

#: What a mail must prove before a workflow runs (:mod:`streams.auth`).
AuthPolicy = Literal["none", "trusted-ar", "dkim-aligned", "dmarc-pass"]
#: The names of 0.x configurations, read as the new ones.
LEGACY_POLICIES: dict[str, AuthPolicy] = {"authserv": "trusted-ar", "dkim": "dkim-aligned"}
#: Workflows that act on a reply (money, access): by default the strictest policy.
STRICT_WORKFLOWS = frozenset({"approval"})


def _read_legacy_require(data: Any) -> Any:
    """``auth_policy: authserv`` -> ``require: trusted-ar``; both keys at once is an error."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    if "auth_policy" in data:
        if "require" in data:
            raise ValueError(
                "set either require or auth_policy (its old name), not both: keep require"
            )
        data["require"] = data.pop("auth_policy")
    if isinstance(data.get("require"), str):
        data["require"] = LEGACY_POLICIES.get(data["require"], data["require"])
    return data


def parse_nameserver(value: str) -> tuple[str, int]:
    """``"127.0.0.1:5353"`` -> ``("127.0.0.1", 5353)``; ``"[::1]:53"`` and a bare host (port 53).

    >>> parse_nameserver("127.0.0.1:5353"), parse_nameserver("[::1]:5300"), parse_nameserver("10.0.0.1")
    (('127.0.0.1', 5353), ('::1', 5300), ('10.0.0.1', 53))
    """
    value = value.strip()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest.lstrip(":") or "53"
    elif value.count(":") == 1:
        host, _, port = value.partition(":")
    else:
        host, port = value, "53"
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not host:port (e.g. 127.0.0.1:53)")
    return host, int(port)


#: The duration syntax of the smtp section (connectors.smtp.config.parse_duration); streams does
#: not import a connector, so the few lines are repeated here.
_AGE = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_AGE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_age(value: str) -> float:
    """Seconds in a duration such as ``90m``, ``36h``, ``2d``.

    >>> parse_age("2d"), parse_age("1.5h")
    (172800.0, 5400.0)
    """
    match = _AGE.match(value.strip())
    if not match:
        raise ValueError(f"{value!r} is not a duration like 90m, 36h or 2d")
    return float(match.group(1)) * _AGE_UNITS[match.group(2)]


class AddressSettings(StrictModel):
    address: str = Field(description="mailbox, e.g. helpdesk@example.com")
    name: str | None = Field(default=None, description="display name")

    @model_validator(mode="after")
    def _no_line_breaks(self) -> AddressSettings:
        # Header injection (DESIGN.md, security rules): nothing we put in a header may break a line.
        for value in (self.address, self.name or ""):
            if "\r" in value or "\n" in value:
                raise ValueError("must not contain CR or LF")
        if "@" not in self.address:
            raise ValueError(f"{self.address!r} is not an address (no '@')")
        return self


class RateLimitSettings(StrictModel):
    """At most ``max_replies`` answered mails per authenticated sender, and at most
    ``max_replies`` mails to any one recipient, within ``window_seconds`` (RFC 3834 §2).

    Counted in the order-independent way :func:`streams.guards.rate_limit` describes.
    """

    max_replies: int = Field(
        default=5,
        ge=1,
        description="answered mails per sender, and mails per recipient, per window",
    )
    window_seconds: float = Field(
        default=3600.0, gt=0, description="length of the sliding window, in seconds"
    )
    exempt_recipients: list[str] = Field(
        default_factory=list,
        description=(
            "recipients not limited per recipient (shell wildcards, case-insensitive): your own "
            "staff that workflows write to by configuration, e.g. the approver, who gets one "
            "forward per request; their mail still counts against the sender"
        ),
    )


class RuleMatch(StrictModel):
    """All given conditions must hold; an empty match matches every mail (a catch-all)."""

    account: str | None = Field(default=None, description="configured account name, exact")
    folder: str | None = Field(default=None, description="folder name, exact")
    recipient: str | None = Field(
        default=None, description="To/Cc address, case-insensitive, shell wildcards (*@x.com)"
    )
    sender: str | None = Field(
        default=None, description="From address, case-insensitive, shell wildcards"
    )
    subject: re.Pattern[str] | None = Field(
        default=None, description="regular expression searched in the subject"
    )
    has_attachment: bool | None = Field(
        default=None, description="true: only mail with attachments; false: only mail without"
    )


class RoutingRule(StrictModel):
    name: str | None = Field(default=None, description="shown in logs and UNROUTED events")
    match: RuleMatch = Field(
        default=RuleMatch(), description="conditions, all of which must hold (none: every mail)"
    )
    workflow: str = Field(description="registered workflow name, e.g. ticket_intake")


class AuthSettings(StrictModel):
    """Our own sender checks (policies ``dkim-aligned`` and ``dmarc-pass``, :mod:`streams.auth`)."""

    trusted_received_by: str | None = Field(
        default=None,
        description=(
            "host name your border MTA writes after 'by' in its Received header; SPF is checked "
            "against the client IP of the topmost Received header of that host. Unset: SPF is "
            "not evaluated and dmarc-pass rests on aligned DKIM (or a trusted ARC sealer) alone"
        ),
    )
    trusted_arc_sealers: list[str] = Field(
        default_factory=list,
        description=(
            "domains (ARC-Seal d=) whose validated ARC chain vouches for forwarded mail under "
            "dmarc-pass: their ARC-Authentication-Results count as our own MTA's would"
        ),
    )
    nameserver: str | None = Field(
        default=None,
        description="DNS server as host:port for SPF, DKIM, DMARC and ARC lookups; unset: the system resolver",
    )
    dns_timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description="timeout of one DNS query; a timeout is a temperror, never a pass",
    )
    dns_cache_size: int = Field(
        default=10_000, ge=0, description="DNS answers kept (each for its TTL at most)"
    )

    @field_validator("nameserver")
    @classmethod
    def _nameserver_is_host_port(cls, value: str | None) -> str | None:
        if value is not None:
            parse_nameserver(value)
        return value


class WorkflowSettings(StrictModel):
    require: AuthPolicy | None = Field(
        default=None,
        description=("overrides streams.require for this workflow (old name: auth_policy)"),
    )
    from_address: AddressSettings | None = Field(
        default=None, description="overrides streams.from_address for this workflow"
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="validated by the workflow's own options model"
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy_auth_policy(cls, data: Any) -> Any:
        return _read_legacy_require(data)


class StreamsSettings(NamespacedModel):
    NAMESPACED = ("app_id",)

    app_id: str = Field(
        default="mailtap-streams",
        description="faust app id: the consumer group and the prefix of the changelog topics",
    )
    from_address: AddressSettings = Field(description="sender of every reply")
    own_addresses: list[str] = Field(
        default_factory=list,
        description="further addresses of ours; mail from them is never answered (loop guard)",
    )
    require: AuthPolicy | None = Field(
        default=None,
        description=(
            "sender authentication required before a workflow runs: none, trusted-ar (our "
            "MTA's Authentication-Results), dkim-aligned (our own DKIM check), dmarc-pass (our "
            "own DMARC evaluation). Unset: dmarc-pass for approval, and for other workflows "
            "trusted-ar when authserv_id is set, else dmarc-pass (old name: auth_policy)"
        ),
    )
    authserv_id: str | None = Field(
        default=None,
        description="the authserv-id of our border MTA; only its Authentication-Results count",
    )
    auth: AuthSettings = Field(
        default=AuthSettings(), description="our own SPF/DKIM/DMARC/ARC checks and their DNS"
    )
    rate_limit: RateLimitSettings = Field(
        default=RateLimitSettings(),
        description="per-sender and per-recipient limit on automatic replies",
    )
    reply_to_allow: list[str] = Field(
        default_factory=list,
        description=(
            "Reply-To addresses honoured even outside the sender's own domain (shell wildcards, "
            "case-insensitive, e.g. '*@tickets.partner.example'); others are answered at From "
            "(streams.mail.answer_address)"
        ),
    )
    rules: list[RoutingRule] = Field(
        default_factory=list,
        description="routing rules, tried in order; unmatched mail is recorded as UNROUTED",
    )
    workflows: dict[str, WorkflowSettings] = Field(
        default_factory=dict, description="per-workflow settings, keyed by workflow name"
    )
    workflow_modules: list[str] = Field(
        default_factory=list,
        description="importable modules with your own @workflow functions (built-ins are loaded)",
    )
    tick_interval_seconds: float = Field(
        default=5.0,
        gt=0,
        description="how often time-driven steps (approval reminders) are checked",
    )
    state_retention_days: float = Field(
        default=30.0,
        gt=0,
        description=(
            "workflow state that reached its final state (a decided approval, a ticket without "
            "mail) and dedupe marks older than this are deleted, so the tables stop growing; a "
            "mail replayed after that is treated as new"
        ),
    )
    max_reply_age: str = Field(
        default="2d",
        description=(
            "mail that arrived longer ago than this (its internal_date: IMAP INTERNALDATE, EWS "
            "DateTimeReceived; else when the source read it) is never answered, only SKIPPED "
            "with guard max_reply_age: a first start with start: all or a replay of mail.events "
            "by a new app_id must not write to old correspondents. A duration: 36h, 2d, 90m"
        ),
    )
    data_dir: str = Field(default=".state/streams", description="faust's local data directory")
    session_timeout_seconds: float = Field(
        default=10.0,
        ge=6.0,
        le=90.0,
        description=(
            "consumer group session timeout: how soon a killed worker's partitions are handed "
            "to its replacement (faust's default is 60 s; heartbeats run on the consumer "
            "thread, so a slow workflow step does not count against it)"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy_auth_policy(cls, data: Any) -> Any:
        return _read_legacy_require(data)

    @field_validator("max_reply_age")
    @classmethod
    def _max_reply_age_is_duration(cls, value: str) -> str:
        if parse_age(value) <= 0:
            raise ValueError("max_reply_age must be longer than 0")
        return value

    @property
    def max_reply_age_seconds(self) -> float:
        return parse_age(self.max_reply_age)

    def policy_for(self, workflow: str) -> AuthPolicy:
        """The workflow's own ``require``, else ``streams.require``, else the default: the
        strictest policy the deployment can evaluate for approvals (``dmarc-pass``: it only
        needs DNS and the raw mail), and for the others what 0.x did (``trusted-ar``) when the
        MTA's id is known."""
        own = self.workflows.get(workflow)
        if own and own.require:
            return own.require
        if self.require:
            return self.require
        if workflow in STRICT_WORKFLOWS or not self.authserv_id:
            return "dmarc-pass"
        return "trusted-ar"

    def from_address_for(self, workflow: str) -> AddressSettings:
        own = self.workflows.get(workflow)
        return own.from_address if own and own.from_address else self.from_address

    @property
    def own_address_set(self) -> frozenset[str]:
        addresses = {self.from_address.address, *self.own_addresses}
        addresses |= {w.from_address.address for w in self.workflows.values() if w.from_address}
        return frozenset(a.strip().lower() for a in addresses)

    @model_validator(mode="after")
    def _authserv_id_when_needed(self) -> StreamsSettings:
        needs = [w for w in self._workflow_names() if self.policy_for(w) == "trusted-ar"]
        if needs and not self.authserv_id:
            raise ValueError(
                f"require 'trusted-ar' (workflows: {', '.join(needs)}) needs authserv_id, the "
                f"authserv-id your border MTA writes into Authentication-Results; or set "
                f"require to 'dmarc-pass', 'dkim-aligned' or 'none'"
            )
        return self

    def _workflow_names(self) -> list[str]:
        return sorted({r.workflow for r in self.rules} | set(self.workflows))
