"""Which records of a batch still need action, decided from the command state.

A command's state (:mod:`connectors.smtp.state`, read back on every partition assignment) says
what an earlier process or an earlier batch did with it:

- no state: a new command, sent (a retry record without state: the state topic was lost; sent);
- ``INTENT`` of this very attempt: a process died between intent and outcome: the command is
  *recovered*, its outcome UNKNOWN, and it is resent later with the same Message-ID;
- ``SCHEDULED`` one attempt back, on a retry record: the retry, sent;
- anything else (DONE, a later attempt, a command id already claimed in the batch): skipped.

A command without state whose ``created_at`` is older than ``smtp.state_retention`` is not sent
(its state may have been pruned after it was sent) but answered FAILED. :meth:`prepare` then
makes the cheap checks before an intent: the max lifetime, the sender address, the Message-ID.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from confluent_kafka import Message

from connectors.core.avro.serde import AvroSerde
from connectors.core.errors import RegistryUnavailable
from connectors.smtp.classify import MAX_DIAGNOSTIC, DeliveryStatus, RecipientOutcome
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.errors import RenderError
from connectors.smtp.identity import message_id_for
from connectors.smtp.recorder import Work, all_recipients
from connectors.smtp.render import ascii_domain_of, normalize_address
from connectors.smtp.retry import RetryInfo, expired
from connectors.smtp.state import StateStore

__all__ = ["CommandAdmission", "render_failed"]

log = logging.getLogger(__name__)


class CommandAdmission:
    """Decodes the sink's records and decides, from the shared state, what each one needs."""

    def __init__(
        self,
        settings: SmtpSinkSettings,
        commands_serde: AvroSerde,
        states: StateStore,
        clock: Callable[[], datetime],
    ) -> None:
        self.settings = settings
        self.commands_serde = commands_serde
        self.states = states
        self.clock = clock

    def admit(
        self,
        record: Message,
        info: RetryInfo | None,
        claimed: set[str],
        dead: list[tuple[Message, str, str]],
    ) -> Work | None:
        """Decode and decide from the state whether this record still needs action."""
        try:
            command = self.commands_serde.decode(record.value() or b"", record.topic() or "")
        except RegistryUnavailable:
            raise  # not a bad record: the caller tries it again once the registry answers
        except Exception as exc:
            dead.append((record, f"undecodable ReplyCommand: {exc}", type(exc).__name__))
            return None
        cid = str(command["command_id"])
        if cid in claimed:
            return None
        state = self.states.get(cid)
        attempt = info.attempt if info is not None else 1
        if state is None and self.older_than_retention(command):
            item = Work(record, command, attempt=attempt, recipients=None)
            item.refused = (
                f"not sent: created at {command['created_at']:%Y-%m-%dT%H:%M:%SZ}, longer ago than "
                f"smtp.state_retention={self.settings.state_retention}: its state may have been "
                f"pruned, so it may have been sent already (a replay of old commands?)"
            )
        elif state is None:
            # A retry record without state only happens when the state topic was lost: send.
            item = Work(
                record,
                command,
                attempt=attempt,
                recipients=info.recipients if info is not None else None,
                last_error=info.last_error if info is not None else None,
            )
        elif state is not None and state.phase == "INTENT" and state.attempt == attempt:
            item = Work(
                record,
                command,
                attempt=attempt,
                recipients=state.pending,
                message_id=state.message_id,
                recovered=True,
            )
        elif (
            state is not None
            and info is not None
            and state.phase == "SCHEDULED"
            and state.attempt == attempt - 1
        ):
            item = Work(
                record,
                command,
                attempt=attempt,
                recipients=info.recipients,
                last_error=info.last_error,
            )
        else:
            log.debug("skip command_id=%s state=%s attempt=%d", cid, state, attempt)
            return None
        claimed.add(cid)
        return item

    def older_than_retention(self, command: dict[str, object]) -> bool:
        created = command.get("created_at")
        retention = timedelta(seconds=self.settings.state_retention_seconds)
        return isinstance(created, datetime) and created < self.clock() - retention

    def prepare(self, item: Work, now: datetime) -> bool:
        """Cheap checks before the intent; False (with outcomes set) when nothing is to be sent.

        Rendering itself happens in :meth:`~connectors.smtp.sender.CommandSender.send`, after the intent: it costs about a millisecond
        of CPU per message, which then overlaps with the relay's work on the other sessions.
        """
        if item.refused:
            log.warning("refused command_id=%s: %s", item.command_id, item.refused)
            item.outcomes = [
                RecipientOutcome(r, DeliveryStatus.FAILED, diagnostic=item.refused)
                for r in all_recipients(item.command)
            ]
            return False
        created = item.command.get("created_at")
        if (
            item.attempt > 1
            and isinstance(created, datetime)
            and expired(created, now, self.settings.max_lifetime_seconds)
        ):
            item.given_up = (
                f"gave up: max lifetime {self.settings.max_lifetime} reached before attempt "
                f"{item.attempt}"
            )
            diagnostic = f"{item.given_up}; last: {item.last_error}"[:MAX_DIAGNOSTIC]
            item.outcomes = [
                RecipientOutcome(r, DeliveryStatus.FAILED, diagnostic=diagnostic)
                for r in item.recipients or all_recipients(item.command)
            ]
            return False
        try:
            sender = normalize_address(
                str(item.command["from"]["address"]), "from.address", utf8=True
            )
            domain = ascii_domain_of(sender, "from.address")  # A-labels, as render() uses
        except RenderError as exc:
            render_failed(item, exc)
            return False
        item.message_id = message_id_for(item.command_id, domain)
        return True


def render_failed(item: Work, exc: RenderError) -> None:
    log.warning("render failed command_id=%s reason=%s", item.command_id, exc.reason)
    item.outcomes = [RecipientOutcome(None, DeliveryStatus.FAILED, diagnostic=exc.reason)]
