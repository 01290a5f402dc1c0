"""One mail through the stream, as a pure function of (record, tables) -> outputs.

The faust app (:mod:`streams.app`) and the in-memory harness (:mod:`streams.testing`) both
drive this class, so what the unit tests exercise is what runs on Kafka.

Per mail::

    tombstone? -> ignored
    route      -> no rule: UNROUTED event
    dedupe (mail key x workflow)         -> nothing published (``Outcome.already_ran``)
    loop guards (RFC 3834, own address)  -> SKIPPED
    arrived before now - max_reply_age   -> SKIPPED (history: start: all, a replay)
    sender authentication (policy)       -> SKIPPED
    rate limit per authenticated sender  -> SKIPPED
    workflow.on_mail -> ReplyCommands + WorkflowEvents + state writes
    rate limit per recipient of those commands -> SKIPPED (the workflow's outputs are dropped
                                                  whole, so its state never claims a mail that
                                                  was not sent)

A mail that already ran its workflow (a flag change, a rescan, a replay, the re-read after a
rebalance) publishes nothing: its workflow's status is on the compacted ``mail.workflow``, often
under the mail's own key (the default instance id), and a SKIPPED event there would take its
place; the dedupe check comes first so that no later guard (the mail's age, once it is old)
speaks for it either. The worker counts it (``mailtap_streams_guard_decisions{guard="dedupe"}``).

The caller publishes ``Outcome.commands`` and ``Outcome.events``, waits for Kafka to
acknowledge them, and only then applies the table writes with :meth:`Pipeline.apply`
(at-least-once: a crash before that replays the mail against the old tables and produces the
same command ids).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Protocol

from connectors.core.avro.replies import ReplyCommand
from streams.auth import (
    Authenticated,
    DnsFunc,
    OwnChecks,
    RawLoader,
    needs_io,
    sender_authentication,
)
from streams.config import AuthPolicy, StreamsSettings
from streams.guards import (
    LOOP_GUARDS,
    Pass,
    Skip,
    Verdict,
    already_ran,
    dedupe_key,
    first_skip,
    rate_key,
    rate_limit,
    record_reply,
    reply_age,
)
from streams.mail import MailView
from streams.routing import route
from streams.workflow import BoundWorkflow, Record, WorkflowContext, WorkflowState, workflow_event

log = logging.getLogger(__name__)

UNROUTED = "UNROUTED"
SKIPPED = "SKIPPED"
FAILED = "FAILED"
#: ``workflow`` field of events about mail that reached no workflow.
ROUTING = "routing"


def wall_clock() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Tables(Protocol):
    """The three tables the pipeline reads; faust Tables in the app, dicts in tests."""

    @property
    def runs(self) -> MutableMapping[str, Any]: ...
    @property
    def rates(self) -> MutableMapping[str, Any]: ...
    @property
    def state(self) -> MutableMapping[str, Any]: ...


@dataclass
class MemoryTables:
    runs: dict[str, Any] = field(default_factory=dict)
    rates: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    commands: list[ReplyCommand] = field(default_factory=list)
    events: list[Record] = field(default_factory=list)
    runs: dict[str, Any] = field(default_factory=dict)
    rates: dict[str, dict[str, Any]] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    """Table writes; a None value deletes the key."""
    #: The workflow this mail had run already (the dedupe table): nothing to do or to publish.
    already_ran: str | None = None


@dataclass(frozen=True)
class Admission:
    """A mail that passed routing, dedupe and the loop guards; authentication comes next."""

    mail: MailView
    workflow: BoundWorkflow
    policy: AuthPolicy

    @property
    def needs_io(self) -> bool:
        return needs_io(self.policy)


class Pipeline:
    def __init__(
        self,
        settings: StreamsSettings,
        workflows: Mapping[str, BoundWorkflow],
        *,
        load_raw: RawLoader | None = None,
        dnsfunc: DnsFunc | None = None,
        clock: Callable[[], dt.datetime] = wall_clock,
    ) -> None:
        """``clock``: "now" for :func:`streams.guards.reply_age` (a mail's age is judged when
        the worker reads it, never earlier than the mail's ``observed_at``)."""
        self.settings = settings
        self.workflows = dict(workflows)
        self._clock = clock
        self._load_raw = load_raw
        self._dnsfunc = dnsfunc
        self._checks = OwnChecks.from_settings(settings.auth)  # one DNS cache per worker
        self._own = settings.own_address_set
        self._exempt_patterns = tuple(settings.rate_limit.exempt_recipients)

    # -- per mail ----------------------------------------------------------------------------

    def admit(self, record: Mapping[str, Any] | None, tables: Tables) -> Admission | Outcome:
        """Everything before authentication: pure and cheap."""
        if record is None:
            return Outcome()  # tombstone: the mail left the mailbox; nothing to answer
        mail = MailView.from_record(record, reply_to_allow=self.settings.reply_to_allow)
        rule = route(mail, self.settings.rules)
        if rule is None:
            return Outcome(events=[_unrouted(mail)])
        bound = self.workflows[rule.workflow]
        if already_ran(mail, bound.name, tables.runs):
            return Outcome(already_ran=bound.name)  # see the module docstring
        verdict = first_skip(mail, LOOP_GUARDS, own_addresses=self._own)
        if isinstance(verdict, Pass):
            verdict = reply_age(
                mail, now=self._clock(), max_age_seconds=self.settings.max_reply_age_seconds
            )
        if isinstance(verdict, Skip):
            return Outcome(events=[_skipped(mail, bound.name, verdict)])
        return Admission(mail, bound, self.settings.policy_for(bound.name))

    def authenticate(self, admission: Admission) -> Verdict:
        """The sender authentication guard; may read the claim-check store and DNS."""
        return sender_authentication(
            admission.mail,
            admission.policy,
            authserv_id=self.settings.authserv_id,
            load_raw=self._load_raw,
            dnsfunc=self._dnsfunc,
            checks=self._checks,
        )

    def run(self, admission: Admission, auth: Verdict, tables: Tables) -> Outcome:
        """Rate limit per sender, the workflow, rate limit per recipient."""
        mail, bound = admission.mail, admission.workflow
        if isinstance(auth, Skip):
            return Outcome(events=[_skipped(mail, bound.name, auth)])
        limit = self.settings.rate_limit
        at = mail.observed_at.timestamp()
        # Per authenticated sender (From), whoever the answer goes to: one sender must not
        # reach more people than one (the old per-reply-address count let a Reply-To per mail
        # reach a new victim every time).
        sender_key = rate_key("sender", mail.sender.address) if mail.sender else None
        if sender_key is not None:
            limited = rate_limit(tables.rates.get(sender_key), at, limit, who=sender_key)
            if isinstance(limited, Skip):
                return Outcome(events=[_skipped(mail, bound.name, limited)])
        state = WorkflowState(bound.name, tables.state)
        ctx = WorkflowContext(
            workflow=bound.name,
            event_key=mail.key,
            mail=mail,
            options=bound.options,
            from_address=bound.from_address,
            state=state,
            now=mail.observed_at,
            authentication=auth if isinstance(auth, Authenticated) else None,
        )
        try:
            bound.registered.on_mail(mail, ctx)
        except Exception as exc:
            # A workflow bug must not stop the stream; the mail is not marked as run, so a
            # fixed workflow picks it up on the next replay.
            log.exception("workflow %s failed on %s", bound.name, mail.key)
            return Outcome(events=[_failed(mail.key, bound.name, exc, mail.observed_at)])
        keys = [] if not ctx.commands or sender_key is None else [sender_key]
        for address in sorted({a for c in ctx.commands for a in _recipients(c)}):
            if self._exempt(address):
                continue
            key = rate_key("recipient", address)
            limited = rate_limit(tables.rates.get(key), at, limit, who=key)
            if isinstance(limited, Skip):
                # All or nothing: half a workflow step (an acknowledgement saying a forward was
                # sent, without the forward) would tell someone something that did not happen.
                return Outcome(events=[_skipped(mail, bound.name, limited)])
            keys.append(key)
        outcome = Outcome(commands=ctx.commands, events=ctx.events, state=state.writes)
        outcome.runs[dedupe_key(mail.key, bound.name)] = {
            "commands": [c["command_id"] for c in ctx.commands],
            "at": mail.observed_at.timestamp(),
        }
        for key in keys:
            outcome.rates[key] = record_reply(tables.rates.get(key), at, limit)
        return outcome

    def _exempt(self, address: str) -> bool:
        return any(fnmatchcase(address, p.strip().lower()) for p in self._exempt_patterns)

    def process(self, record: Mapping[str, Any] | None, tables: Tables) -> Outcome:
        """admit -> authenticate -> run, synchronously (tests and the in-memory harness)."""
        admitted = self.admit(record, tables)
        if isinstance(admitted, Outcome):
            return admitted
        return self.run(admitted, self.authenticate(admitted), tables)

    # -- time-driven steps -------------------------------------------------------------------

    def tick(self, now: dt.datetime, tables: Tables) -> Outcome:
        """Run every workflow's ``on_tick`` (e.g. approval reminders) at ``now``."""
        outcome = Outcome()
        for bound in self.workflows.values():
            if bound.registered.on_tick is None:
                continue
            state = WorkflowState(bound.name, tables.state)
            ctx = WorkflowContext(
                workflow=bound.name,
                event_key=None,
                mail=None,
                options=bound.options,
                from_address=bound.from_address,
                state=state,
                now=now,
            )
            try:
                bound.registered.on_tick(ctx)
            except Exception as exc:
                log.exception("workflow %s failed on tick", bound.name)
                outcome.events.append(_failed(f"tick/{bound.name}", bound.name, exc, now))
                continue
            outcome.commands += ctx.commands
            outcome.events += ctx.events
            outcome.state.update(state.writes)
        return outcome

    def sweep(self, now: dt.datetime, tables: Tables) -> Outcome:
        """Deletions of everything final since before ``now`` minus the retention: dedupe marks
        of mails observed before it, and what each workflow's ``expire`` names.

        A dedupe mark written before marks carried their time (a bare list) is kept.
        """
        before = now - dt.timedelta(days=self.settings.state_retention_days)
        cutoff = before.timestamp()
        outcome = Outcome()
        for key, run in list(tables.runs.items()):
            if isinstance(run, dict) and float(run.get("at", cutoff)) < cutoff:
                outcome.runs[key] = None
        for bound in self.workflows.values():
            if bound.registered.expire is None:
                continue
            state = WorkflowState(bound.name, tables.state)
            try:
                bound.registered.expire(state, before)
            except Exception:
                log.exception("workflow %s failed in its retention sweep", bound.name)
                continue
            outcome.state.update(state.writes)
        return outcome

    @staticmethod
    def apply(outcome: Outcome, tables: Tables) -> None:
        """Write the outcome's table changes (after its outputs were acknowledged)."""
        for key, value in outcome.state.items():
            if value is None:
                tables.state.pop(key, None)
            else:
                tables.state[key] = value
        for key, window in outcome.rates.items():
            tables.rates[key] = window
        # Last: once a run is marked, a replay skips the mail, so everything else must be durable.
        for key, value in outcome.runs.items():
            if value is None:
                tables.runs.pop(key, None)
            else:
                tables.runs[key] = value


def _recipients(command: ReplyCommand) -> set[str]:
    return {str(a["address"]).strip().lower() for a in [*command["to"], *command["cc"]]}


def _unrouted(mail: MailView) -> Record:
    return workflow_event(
        instance_id=mail.key,
        workflow=ROUTING,
        status=UNROUTED,
        event_key=mail.key,
        attributes={
            "account": mail.account,
            "folder": mail.folder,
            "from": mail.sender.address if mail.sender else None,
            "subject": mail.subject,
        },
        at=mail.observed_at,
    )


def _skipped(mail: MailView, workflow: str, skip: Skip) -> Record:
    return workflow_event(
        instance_id=mail.key,
        workflow=workflow,
        status=SKIPPED,
        event_key=mail.key,
        attributes={
            "guard": skip.guard,
            "reason": skip.reason,
            "from": mail.sender.address if mail.sender else None,
            "subject": mail.subject,
        },
        at=mail.observed_at,
    )


def _failed(instance: str, workflow: str, exc: Exception, at: dt.datetime) -> Record:
    return workflow_event(
        instance_id=instance,
        workflow=workflow,
        status=FAILED,
        event_key=None if instance.startswith("tick/") else instance,
        attributes={"error": f"{type(exc).__name__}: {exc}"},
        at=at,
    )
