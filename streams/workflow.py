"""The workflow API: what a workflow module sees and how it is registered.

A workflow is a function (or a class with ``on_mail`` and optionally ``on_tick``) registered by
name; routing rules name it. It receives the typed :class:`~streams.mail.MailView` and a
:class:`WorkflowContext`, and acts only through the context::

    from streams.mail import MailView
    from streams.workflow import WorkflowContext, workflow

    @workflow("hello")
    def hello(mail: MailView, ctx: WorkflowContext) -> None:
        if ctx.state.get(f"greeted/{mail.sender.normalized}"):
            return
        ctx.reply("greeting", "Hello! We got your mail.")
        ctx.state.set(f"greeted/{mail.sender.normalized}", True)
        ctx.emit("GREETED", {"sender": mail.sender.address})

Rules the runtime relies on:

- **Deterministic outputs.** A workflow must derive everything from the mail, its state and
  ``ctx.now`` (the mail's ``observed_at``; the tick time in ``on_tick``). Command ids are
  ``sha256(event key, workflow, step)`` (:func:`command_id`), so a replay or a rebalance
  re-emits the *same* commands and the SMTP sink skips those it already sent. A step name may be
  used once per event.
- **One answer per mail.** A ``reply()`` to the current mail's sender in its own thread (no
  ``thread``, no ``to``) is *the answer* to that mail, whatever its step: its command id derives
  from the fixed step :data:`ANSWER`, and a second answer to the same mail is an error. A replay
  with empty state may read the mails of a thread in another order (they are on different
  partitions) and take another branch — a follow-up seen before its request opens a ticket — but
  it still produces the same answer id, so the sink sends nothing new. The step name stays in the
  command's ``step`` field.
- **State is buffered.** ``ctx.state.set`` becomes visible to later ``get`` calls at once but is
  written to the changelog-backed table only after the commands and events were acknowledged by
  Kafka, so a crash in between replays the mail against the old state.
- **State values are JSON** (dicts, lists, strings, numbers, booleans, None).
- **State is per conversation** (:mod:`connectors.core.mail.conversation`): a mail sees the state written
  by the mails of its own thread (same thread root); with several workers, state of another
  conversation may live on another worker. Key state by what the thread carries (Message-IDs).
- **State ends**: an ``expire(state, before)`` hook deletes entries whose final state is older
  than ``before`` (``streams.state_retention_days``); a replay inside the retention still meets
  them, later it is treated as new mail.
- **Answers go where** :func:`streams.mail.answer_address` **says** (``mail.reply_address``):
  Reply-To only within the sender's own domain or ``streams.reply_to_allow``, else From. Use
  ``ctx.reply()`` rather than building recipients from ``mail.reply_to``.
- **What was authenticated** is ``ctx.authentication`` (:class:`streams.auth.Authenticated`):
  the From *domain*, the DKIM domains that signed, the envelope sender. A workflow that acts on
  a person's word (an approval) must check more than the domain (see ``workflows/approval.py``).
- **A step is sent whole or not at all**: when a recipient of its commands is over the rate
  limit the mail's whole outcome is dropped, so never tell anyone in one command that another
  was sent unless it is emitted in the same step.

Replies thread (DESIGN.md): ``In-Reply-To`` = the original Message-ID, ``References`` = the
original References + the original Message-ID, subject ``Re: ...`` (never ``Re: Re: ...``),
``Auto-Submitted: auto-replied``.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import importlib
import inspect
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from pydantic import BaseModel, ValidationError

from connectors.core.avro.replies import AttachmentRef, CommandKindSymbol, ReplyCommand
from connectors.core.avro.shared import Address as AddressRecord
from connectors.core.errors import ConfigError
from streams.config import AddressSettings, StreamsSettings
from streams.errors import HeaderInjectionError
from streams.mail import Address, AttachmentView, MailView, ThreadRef

if TYPE_CHECKING:
    from streams.auth import Authenticated

Record = dict[str, Any]

#: The step every answer to a mail's sender derives its command id from (one answer per mail).
ANSWER: Final = "answer"

#: Modules imported at start so that their ``@workflow`` decorators run.
BUILTIN_MODULES: Final = ("streams.workflows.ticket_intake", "streams.workflows.approval")

_REPLY_PREFIX = re.compile(r"^\s*(re|aw|sv)\s*(\[\d+\])?\s*:\s*", re.IGNORECASE)
_FORWARD_PREFIX = re.compile(r"^\s*(fwd?|wg)\s*:\s*", re.IGNORECASE)
#: What may not stay in a header value: C0 controls (CR, LF, TAB, NUL...), DEL, C1 controls
#: (U+0085 NEL among them) and the Unicode line and paragraph separators, which the email
#: package and some clients treat as line breaks. The renderer refuses them all.
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+\s*")
_PATH_SEPARATORS = re.compile(r"[/\\]")
#: Longest attachment name we hand on (RFC 2183 sets no limit; file systems stop at 255 bytes).
MAX_FILENAME_CHARS = 120
#: MIME type of an attachment whose declared type is not a plain ``type/subtype``.
FALLBACK_CONTENT_TYPE = "application/octet-stream"
_MIME_TYPE = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+/[A-Za-z0-9!#$%&'*+.^_`|~-]+")


def command_id(event_key: str, workflow: str, step: str) -> str:
    """``sha256(event key, workflow, step)`` in hex: the same inputs give the same command."""
    return hashlib.sha256("\x1f".join((event_key, workflow, step)).encode()).hexdigest()


def short_id(event_key: str) -> str:
    """A stable 8-character id of a mail (a ticket number, an approval id): the first 8 base32
    characters of ``sha256(event key)``.

    Base32 turns each 5 bytes into 8 characters on their own, so the digest's first 5 bytes give
    them (pure-Python ``b32encode`` costs per byte)."""
    return base64.b32encode(hashlib.sha256(event_key.encode()).digest()[:5]).decode()


def one_line(text: str | None) -> str:
    """A header value from untrusted text: line breaks and other controls become one space.

    >>> one_line("Printer\\r\\n  broken\\u2028now\\x00!")
    'Printer broken now !'
    """
    return _CONTROLS.sub(" ", text or "").strip()


def safe_filename(name: str | None) -> str:
    """An attachment name from untrusted text, safe in a MIME header and on a disk.

    The rule: controls and line breaks (as in :func:`one_line`) become one space; ``/`` and
    ``\\`` become ``_`` (no path); white space and dots are trimmed at both ends (no hidden or
    ``..`` names); at most :data:`MAX_FILENAME_CHARS` characters, the extension kept; nothing
    left gives ``attachment``. The forward renders then, instead of failing at the sink.

    >>> safe_filename("receipt\\r\\nBcc: x@attacker.example\\r\\n.pdf")
    'receipt Bcc: x@attacker.example .pdf'
    >>> safe_filename("../../etc/passwd"), safe_filename(" \\t")
    ('_.._etc_passwd', 'attachment')
    """
    text = _PATH_SEPARATORS.sub("_", one_line(name)).strip(" .")
    if len(text) > MAX_FILENAME_CHARS:
        stem, dot, ext = text.rpartition(".")
        ext = ext if dot and stem and len(ext) <= 10 else ""
        keep = MAX_FILENAME_CHARS - (len(ext) + 1 if ext else 0)
        text = f"{text[:keep].rstrip(' .')}.{ext}" if ext else text[:keep].rstrip(" .")
    return text or "attachment"


def safe_content_type(value: str | None) -> str:
    """``type/subtype`` lower-cased, or :data:`FALLBACK_CONTENT_TYPE` for anything else."""
    text = (value or "").strip().lower()
    return text if _MIME_TYPE.fullmatch(text) else FALLBACK_CONTENT_TYPE


def reply_subject(subject: str | None) -> str:
    """``Re: `` once: ``"RE: Re: x"`` stays ``"RE: Re: x"``, ``"x"`` becomes ``"Re: x"``."""
    text = one_line(subject) or "(no subject)"
    return text if _REPLY_PREFIX.match(text) else f"Re: {text}"


def forward_subject(subject: str | None) -> str:
    text = one_line(subject) or "(no subject)"
    return text if _FORWARD_PREFIX.match(text) else f"Fwd: {text}"


def thread_references(ref: ThreadRef) -> list[str]:
    """RFC 5322 §3.6.4: the parent's References followed by the parent's Message-ID."""
    refs = list(ref.references)
    if ref.message_id and ref.message_id not in refs:
        refs.append(ref.message_id)
    return refs


def _address(value: Address) -> AddressRecord:
    for part in (value.address, value.name or ""):
        if "\r" in part or "\n" in part:
            raise HeaderInjectionError(f"address {value.address!r} contains CR or LF")
    return value.to_record()


class WorkflowState:
    """A workflow's view of the state table: its own key space, writes buffered until commit."""

    def __init__(self, workflow: str, table: Mapping[str, Any]) -> None:
        self._prefix = f"{workflow}/"
        self._table = table
        self.writes: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        full = self._prefix + key
        if full in self.writes:
            value = self.writes[full]
            return default if value is None else value
        value = self._table.get(full)
        return default if value is None else value

    def set(self, key: str, value: Any) -> None:
        if value is None:
            raise ValueError("None deletes; call delete()")
        self.writes[self._prefix + key] = value

    def delete(self, key: str) -> None:
        self.writes[self._prefix + key] = None

    def items(self, prefix: str = "") -> Iterator[tuple[str, Any]]:
        """Current entries whose key starts with ``prefix`` (buffered writes included)."""
        full = self._prefix + prefix
        scan = getattr(self._table, "scan", None)  # a partition's view: an indexed scan
        entries = scan(full) if scan is not None else list(self._table.items())
        merged = {k: v for k, v in entries if k.startswith(full)}
        merged.update({k: v for k, v in self.writes.items() if k.startswith(full)})
        for key, value in sorted(merged.items()):
            if value is not None:
                yield key[len(self._prefix) :], value


class WorkflowContext:
    """Everything a workflow may do. Outputs collect in :attr:`commands` and :attr:`events`."""

    def __init__(
        self,
        *,
        workflow: str,
        event_key: str | None,
        mail: MailView | None,
        options: Any,
        from_address: AddressSettings,
        state: WorkflowState,
        now: dt.datetime,
        authentication: Authenticated | None = None,
    ) -> None:
        self.workflow = workflow
        #: What the sender-authentication guard established for the current mail (the DKIM
        #: domains that signed, the envelope sender); None in ``on_tick``.
        self.authentication = authentication
        self.event_key = event_key
        self.mail = mail
        self.options = options
        self.from_address = Address(from_address.address, from_address.name)
        self.state = state
        self.now = now
        self.commands: list[ReplyCommand] = []
        self.events: list[Record] = []
        self._steps: set[tuple[str, str]] = set()

    # -- commands ---------------------------------------------------------------------------

    def reply(
        self,
        step: str,
        text_body: str,
        *,
        thread: ThreadRef | None = None,
        to: Sequence[Address] | None = None,
        cc: Sequence[Address] = (),
        subject: str | None = None,
        html_body: str | None = None,
        event_key: str | None = None,
    ) -> str:
        """Answer ``thread`` (default: the current mail) in its thread. Returns the command id.

        Without ``thread`` and ``to`` this is the mail's one answer (see the module docs).
        ``event_key`` derives the id from another mail's key: the mail that caused this reply
        when it is applied later (a decision kept until its request arrived).
        """
        ref = thread or self._current().thread_ref()
        recipients = list(to) if to is not None else [a for a in [ref.reply_address] if a]
        return self._command(
            "REPLY",
            step,
            id_step=ANSWER if thread is None and to is None else step,
            to=recipients,
            cc=cc,
            subject=subject if subject is not None else reply_subject(ref.subject),
            text_body=text_body,
            html_body=html_body,
            in_reply_to=ref.message_id,
            references=thread_references(ref),
            event_key=event_key,
        )

    def forward(
        self,
        step: str,
        to: Sequence[Address],
        text_body: str,
        *,
        subject: str | None = None,
        include_attachments: bool = True,
    ) -> str:
        """Forward the current mail (quoted below ``text_body``, attachments by claim-check URI).

        Attachments go with their names made safe (:func:`safe_filename`); those not in the
        claim-check store cannot go (:func:`forwardable_attachments` says which do).
        The forward carries the original's References + Message-ID, so answers to it name the
        original mail and the workflow can find its way back.
        """
        mail = self._current()
        quoted = "\n".join(
            [
                text_body.rstrip(),
                "",
                "---------- Forwarded message ----------",
                f"From: {_show(mail.sender)}",
                f"Date: {(mail.date or mail.observed_at).isoformat()}",
                f"Subject: {one_line(mail.subject)}",
                f"To: {', '.join(_show(a) for a in mail.to)}",
                "",
                mail.text_body or "(no text part)",
            ]
        )
        attachments: list[AttachmentRef] = [
            {
                "filename": safe_filename(a.filename),
                "content_type": safe_content_type(a.content_type),
                "uri": a.uri,
                "sha256": a.sha256,
                "size": a.size,
            }
            for a in (forwardable_attachments(mail) if include_attachments else ())
            if a.uri  # what forwardable_attachments checks; said again for the type checker
        ]
        return self._command(
            "FORWARD",
            step,
            to=to,
            subject=subject if subject is not None else forward_subject(mail.subject),
            text_body=quoted,
            references=thread_references(mail.thread_ref()),
            attachments=attachments,
        )

    def send(
        self,
        step: str,
        to: Sequence[Address],
        subject: str,
        text_body: str,
        *,
        event_key: str | None = None,
        thread: ThreadRef | None = None,
    ) -> str:
        """A new mail (e.g. a reminder from ``on_tick``, where ``event_key`` names the mail the
        reminder belongs to). With ``thread`` it is placed in that thread."""
        return self._command(
            "SEND",
            step,
            to=to,
            subject=one_line(subject),
            text_body=text_body,
            references=thread_references(thread) if thread else [],
            in_reply_to=thread.message_id if thread else None,
            event_key=event_key,
        )

    def emit(
        self,
        status: str,
        attributes: Mapping[str, object] | None = None,
        *,
        instance_id: str | None = None,
        event_key: str | None = None,
    ) -> None:
        """Publish a status event on ``mail.workflow`` (key: ``instance_id``, default the mail key)."""
        key = event_key or self.event_key
        instance = instance_id or key
        if not instance:
            raise ValueError("emit() outside a mail needs instance_id")
        self.events.append(
            workflow_event(
                instance_id=instance,
                workflow=self.workflow,
                status=status,
                event_key=key,
                attributes=attributes or {},
                at=self.now,
            )
        )

    # -- internals ----------------------------------------------------------------------------

    def _current(self) -> MailView:
        if self.mail is None:
            raise RuntimeError("reply()/forward() need a mail; in on_tick use send(event_key=...)")
        return self.mail

    def _command(
        self,
        kind: CommandKindSymbol,
        step: str,
        *,
        to: Sequence[Address],
        subject: str,
        text_body: str,
        cc: Sequence[Address] = (),
        html_body: str | None = None,
        in_reply_to: str | None = None,
        references: Iterable[str] = (),
        attachments: Sequence[AttachmentRef] = (),
        event_key: str | None = None,
        id_step: str | None = None,
    ) -> str:
        key = event_key or self.event_key
        id_step = id_step or step
        if not key:
            raise ValueError(f"step {step!r}: no event key to derive the command id from")
        if (key, id_step) in self._steps:
            what = "a second answer to" if id_step == ANSWER else f"step {step!r} used twice for"
            raise ValueError(f"{what} {key}: command ids would collide")
        if not to:
            raise ValueError(f"step {step!r}: no recipient")
        self._steps.add((key, id_step))
        cid = command_id(key, self.workflow, id_step)
        self.commands.append(
            {
                "schema_version": 1,
                "command_id": cid,
                "kind": kind,
                "workflow": self.workflow,
                "step": step,
                "event_key": key,
                "from": _address(self.from_address),
                "to": [_address(a) for a in to],
                "cc": [_address(a) for a in cc],
                "bcc": [],
                "reply_to": [],
                "subject": one_line(subject),
                "text_body": text_body,
                "html_body": html_body,
                "attachments": list(attachments),
                "in_reply_to": in_reply_to,
                "references": list(references),
                "auto_submitted": "auto-replied",
                "created_at": self.now,
            }
        )
        return cid


def forwardable_attachments(mail: MailView) -> list[AttachmentView]:
    """The attachments :meth:`WorkflowContext.forward` passes on: those in the claim-check store."""
    return [a for a in mail.attachments if a.uri]


def _show(address: Address | None) -> str:
    if address is None:
        return "(unknown)"
    return f"{one_line(address.name)} <{address.address}>" if address.name else address.address


def workflow_event(
    *,
    instance_id: str,
    workflow: str,
    status: str,
    event_key: str | None,
    attributes: Mapping[str, object],
    at: dt.datetime,
) -> Record:
    """A ``WorkflowEvent`` record (schemas/WorkflowEvent.avsc)."""
    return {
        "schema_version": 1,
        "instance_id": instance_id,
        "workflow": workflow,
        "status": status,
        "event_key": event_key,
        "attributes": {str(k): "" if v is None else str(v) for k, v in attributes.items()},
        "occurred_at": at,
    }


# -- registry -------------------------------------------------------------------------------

MailHandler = Callable[[MailView, WorkflowContext], None]
TickHandler = Callable[[WorkflowContext], None]
#: ``(state, before)``: delete (``state.delete``) the entries whose final state was reached
#: before ``before`` (the retention sweep; ``streams.state_retention_days``).
ExpireHandler = Callable[[WorkflowState, dt.datetime], None]


@dataclass(frozen=True)
class RegisteredWorkflow:
    name: str
    on_mail: MailHandler
    on_tick: TickHandler | None
    options_model: type[BaseModel] | None
    expire: ExpireHandler | None = None


@dataclass(frozen=True)
class BoundWorkflow:
    """A registered workflow with its validated options and sender, ready to run."""

    registered: RegisteredWorkflow
    options: Any
    from_address: AddressSettings

    @property
    def name(self) -> str:
        return self.registered.name


_REGISTRY: dict[str, RegisteredWorkflow] = {}


def workflow(
    name: str,
    *,
    options: type[BaseModel] | None = None,
    expire: ExpireHandler | None = None,
) -> Callable[[Any], Any]:
    """Register a function ``(mail, ctx) -> None`` or a class with ``on_mail(mail, ctx)`` and
    optionally ``on_tick(ctx)`` and ``expire(state, before)`` under ``name``. ``options``
    validates ``streams.workflows.<name>.options``; the instance is ``ctx.options``.
    ``expire`` (for a function workflow) deletes state whose final state is older than the
    retention; without it a workflow's state is never swept."""

    def register(target: Any) -> Any:
        if inspect.isclass(target):
            instance: Any = target()
            entry = RegisteredWorkflow(
                name,
                instance.on_mail,
                getattr(instance, "on_tick", None),
                options,
                getattr(instance, "expire", None),
            )
        else:
            entry = RegisteredWorkflow(name, target, None, options, expire)
        existing = _REGISTRY.get(name)
        if existing is not None and existing.on_mail.__qualname__ != entry.on_mail.__qualname__:
            raise ValueError(f"workflow {name!r} is already registered")
        _REGISTRY[name] = entry
        return target

    return register


def bind_workflows(
    settings: StreamsSettings, modules: Iterable[str] = BUILTIN_MODULES
) -> dict[str, BoundWorkflow]:
    """Import workflow modules, then validate every workflow the configuration names.

    Raises :class:`ConfigError` naming the key to fix.
    """
    for module in [*modules, *settings.workflow_modules]:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"streams.workflow_modules: cannot import {module!r}: {exc}") from exc
    names = {r.workflow for r in settings.rules} | set(settings.workflows)
    bound: dict[str, BoundWorkflow] = {}
    for name in sorted(names):
        entry = _REGISTRY.get(name)
        if entry is None:
            raise ConfigError(
                f"streams: workflow {name!r} is not registered; known: "
                f"{', '.join(sorted(_REGISTRY)) or 'none'} (add its module to "
                f"streams.workflow_modules)"
            )
        raw = settings.workflows[name].options if name in settings.workflows else {}
        options: Any = raw
        if entry.options_model is not None:
            try:
                options = entry.options_model.model_validate(raw)
            except ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
                )
                raise ConfigError(f"streams.workflows.{name}.options: {problems}") from None
        bound[name] = BoundWorkflow(entry, options, settings.from_address_for(name))
    return bound
