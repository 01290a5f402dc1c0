"""The console's actions: each is audited (:mod:`.audit`) and then calls the one function the
CLI command of the same name calls; the API and the page's forms both come through here.

=====================  ==========================================  =============================
console                shared function                             CLI
=====================  ==========================================  =============================
DLQ replay             ``dlq.plan_replay`` + ``dlq.replay_records``  ``mailtap dlq replay``
                       then ``dlq.drop_records`` (reason replayed)
DLQ drop               ``dlq.drop_records``                        ``mailtap dlq drop``
mailbox add/remove     ``mailboxes.change_mailbox``                ``mailtap mailboxes add|remove``
mailbox pause/resume   ``mailboxes.change_mailbox`` (REMOVED/ADDED)  ``remove`` / ``add``
mailbox rewind         ``mailboxes.rewind_mailbox``                ``mailtap mailboxes rewind``
suppression add/remove ``suppressions.add_/remove_suppression``    ``mailtap suppressions``
=====================  ==========================================  =============================

A replayed record is marked handled (as ``dlq drop`` does, reason ``replayed``) so that it
leaves the console's open list; ``mailtap dlq list --all`` still shows it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from connectors.core.config import MailtapConfig
from connectors.core.errors import ConfigError
from connectors.core.source.ownership.catalog import ADDED, REMOVED
from connectors.core.source.ownership.group import WorkUnit
from mailtap.commands import dlq, mailboxes, suppressions
from mailtap.commands.errors import ActionError, NotApplicable, UnknownTarget
from mailtap.console.audit import AuditTrail
from mailtap.console.settings import ConsoleSettings
from mailtap.console.snapshot import SnapshotCache
from mailtap.console.tokens import Principal, TokenBook

T = TypeVar("T")


@dataclass
class Console:
    """Everything a request needs: the configuration, who may do what, the trail, the data."""

    cfg: MailtapConfig
    settings: ConsoleSettings
    tokens: TokenBook
    audit: AuditTrail
    cache: SnapshotCache

    def audited(
        self,
        who: Principal,
        action: str,
        target: str,
        params: dict[str, Any],
        run: Callable[[], T],
    ) -> T:
        """Write the intent, act, write the outcome."""
        entry = self.audit.started(who, action, target, params)
        try:
            result = run()
        except (ActionError, ConfigError) as exc:
            self.audit.finished(entry, f"refused: {exc}")
            raise
        except Exception as exc:
            self.audit.finished(entry, f"failed: {type(exc).__name__}")
            raise
        self.audit.finished(entry, "done")
        return result

    # --- DLQ -------------------------------------------------------------------------------

    def replay(self, who: Principal, record: str, *, reset_state: bool) -> dict[str, Any]:
        topic = self.cfg.kafka.topics.dlq
        seen, note = dlq.find_record(self.cfg.kafka, topic, record)  # UnknownTarget: 404
        if note is not None:
            raise NotApplicable(f"record {record} was already handled ({note.get('reason')})")

        def run() -> dict[str, Any]:
            plan = dlq.plan_replay(self.cfg.kafka, [seen])
            if not plan.chosen:
                raise NotApplicable(f"record {record} is not replayed: {plan.skipped[0][1]}")
            dlq.replay_records(self.cfg, plan.chosen, reset_state=reset_state)
            dlq.drop_records(self.cfg, topic, plan.chosen, reason="replayed", by=_by(who))
            return {"id": record, "replayed_to": self.cfg.kafka.topics.commands}

        result = self.audited(who, "dlq.replay", record, {"reset_state": reset_state}, run)
        self.cache.without_dlq([record])
        return result

    def drop(self, who: Principal, record: str, *, reason: str) -> dict[str, Any]:
        topic = self.cfg.kafka.topics.dlq
        seen, note = dlq.find_record(self.cfg.kafka, topic, record)
        if note is not None:
            raise NotApplicable(f"record {record} was already handled ({note.get('reason')})")

        def run() -> dict[str, Any]:
            target = dlq.drop_records(self.cfg, topic, [seen], reason=reason, by=_by(who))
            return {"id": record, "recorded_on": target}

        result = self.audited(who, "dlq.drop", record, {"reason": reason}, run)
        self.cache.without_dlq([record])
        return result

    # --- mailboxes -------------------------------------------------------------------------

    def known(self, unit: WorkUnit) -> bool:
        """A mailbox the sources want, or one the topics know (a cursor, events, dead letters)."""
        if any(row["mailbox"] == str(unit) for row in mailboxes.mailbox_listing(self.cfg)):
            return True
        return any(row["mailbox"] == str(unit) for row in self.cache.get().mailboxes)

    def change(self, who: Principal, unit: WorkUnit, verb: str) -> dict[str, Any]:
        """``add`` | ``remove`` | ``pause`` | ``resume`` | ``rewind`` one mailbox."""
        if verb != "add" and not self.known(unit):
            raise UnknownTarget(f"unknown mailbox {unit}")
        mailboxes.check_mailbox(self.cfg, unit)  # a ConfigError before anything is recorded
        if verb == "rewind":
            run: Callable[[], None] = lambda: mailboxes.rewind_mailbox(self.cfg, unit)  # noqa: E731
        else:
            state = ADDED if verb in ("add", "resume") else REMOVED
            run = lambda: mailboxes.change_mailbox(self.cfg, unit, state)  # noqa: E731
        self.audited(who, f"mailbox.{verb}", str(unit), {}, run)
        self.cache.refresh()  # the table shows the new state (rare: worth a whole reading)
        return {"mailbox": str(unit), "done": verb}

    # --- suppressions ----------------------------------------------------------------------

    def suppress(
        self, who: Principal, address: str, *, reason: str, note: str | None
    ) -> dict[str, Any]:
        key = suppressions.suppression_key(address)  # InvalidInput before anything is written
        self.audited(
            who,
            "suppression.add",
            key,
            {"reason": reason, "note": note},
            lambda: suppressions.add_suppression(
                self.cfg.kafka, address, reason=reason, note=note, by=_by(who)
            ),
        )
        return {"address": key, "suppressed": True}

    def unsuppress(self, who: Principal, address: str) -> dict[str, Any]:
        key = suppressions.suppression_key(address)
        if key not in suppressions.read_list(self.cfg.kafka):
            raise UnknownTarget(f"{key} is not on the suppression list")
        self.audited(
            who,
            "suppression.remove",
            key,
            {},
            lambda: suppressions.remove_suppression(self.cfg.kafka, address),
        )
        return {"address": key, "suppressed": False}


def _by(who: Principal) -> str:
    return f"console:{who.name}"
