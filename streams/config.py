"""Settings of the streams worker: the ``streams`` section of the mailtap YAML.

Example (the rules are tried in order, the first match picks the workflow)::

    streams:
      app_id: mailtap-streams
      from_address: {name: Helpdesk, address: helpdesk@example.com}
      auth_policy: authserv            # none | authserv | dkim; per workflow below
      authserv_id: mx.example.com      # whose Authentication-Results we trust
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
          auth_policy: none

Validated at start-up (:func:`streams.workflow.bind_workflows`): a rule naming an unknown
workflow or workflow options of the wrong shape stop the worker with the key path to fix.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

AuthPolicy = Literal["none", "authserv", "dkim"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AddressSettings(_Strict):
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


class RateLimitSettings(_Strict):
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


class RuleMatch(_Strict):
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


class RoutingRule(_Strict):
    name: str | None = Field(default=None, description="shown in logs and UNROUTED events")
    match: RuleMatch = Field(
        default=RuleMatch(), description="conditions, all of which must hold (none: every mail)"
    )
    workflow: str = Field(description="registered workflow name, e.g. ticket_intake")


class WorkflowSettings(_Strict):
    auth_policy: AuthPolicy | None = Field(
        default=None, description="overrides streams.auth_policy for this workflow"
    )
    from_address: AddressSettings | None = Field(
        default=None, description="overrides streams.from_address for this workflow"
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="validated by the workflow's own options model"
    )


class StreamsSettings(_Strict):
    app_id: str = Field(
        default="mailtap-streams",
        description="faust app id: the consumer group and the prefix of the changelog topics",
    )
    from_address: AddressSettings = Field(description="sender of every reply")
    own_addresses: list[str] = Field(
        default_factory=list,
        description="further addresses of ours; mail from them is never answered (loop guard)",
    )
    auth_policy: AuthPolicy = Field(
        default="authserv", description="sender authentication required before a workflow runs"
    )
    authserv_id: str | None = Field(
        default=None,
        description="the authserv-id of our border MTA; only its Authentication-Results count",
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

    def policy_for(self, workflow: str) -> AuthPolicy:
        own = self.workflows.get(workflow)
        return own.auth_policy if own and own.auth_policy else self.auth_policy

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
        needs = [w for w in self._workflow_names() if self.policy_for(w) == "authserv"]
        if needs and not self.authserv_id:
            raise ValueError(
                f"auth_policy 'authserv' (workflows: {', '.join(needs)}) needs authserv_id, the "
                f"authserv-id your border MTA writes into Authentication-Results; or set "
                f"auth_policy to 'dkim' or 'none'"
            )
        return self

    def _workflow_names(self) -> list[str]:
        return sorted({r.workflow for r in self.rules} | set(self.workflows))
