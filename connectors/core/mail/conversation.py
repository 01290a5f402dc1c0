"""The conversation key: which partition of the streams worker's repartition topic a mail's state
lives on.

The sources compute it from the event they publish and send it with the record, in the header
``mailtap.conversation`` (:data:`CONVERSATION_HEADER`), so that the streams worker re-keys a
record without decoding it (issue 29: the worker decoded each record twice, to re-key it and
to handle it, ~40 µs each). A record without the header (written before it was added) is
decoded and keyed by the same function.

Workflow state is per conversation (a ticket and its thread, an approval request and its
answers). To let several workers share the load with correct state, :mod:`streams.app`
re-keys every ``mail.events`` record by its conversation onto an internal topic
(``<app_id>-mail-events-by-conversation``), so that every mail of one conversation lands on one
partition and one worker, whatever partition of ``mail.events`` it arrived on.

The key must be computable from **one mail alone** (no state: the repartition step runs before
any table is read), and the same mail must always get the same key (a replay after a kill
lands on the same partition and meets the same state). The rule, first that applies:

1. the **thread root**: the first Message-ID of ``References`` (RFC 5322 §3.6.4: each reply
   carries its parent's References followed by the parent's Message-ID, so the first entry is
   the mail that started the thread);
2. else ``In-Reply-To`` (a reply from a client that writes no References);
3. else the mail's own ``Message-ID`` (a new mail starts its own conversation);
4. else the mail's identity key (no Message-ID at all).

Message-IDs are compared without angle brackets, white space or case. This covers both built-in
workflows: a ticket's follow-ups answer the opening mail's thread, and the approver's answer
answers the forward, whose References are the request's References plus its Message-ID, so its
thread root is the request's.

Limits (``streams/README.md``): a reply whose References were stripped or trimmed to the parent
(some clients keep only In-Reply-To), and a mail that names its ticket or approval only by the
subject tag (``[#NUMBER]``, ``[APPROVAL ID]``, a new mail without References), start a
conversation of their own. With one worker every partition is local and the workflow still
finds the ticket by its tag; with several, only when the same worker owns both partitions,
otherwise it is treated like a mail of an unknown thread (a new ticket; an approval answer kept
as an early answer).

>>> conversation_key({"key": "acme/b@x", "message_id": "<b@x>", "in_reply_to": "<a2@x>",
...                   "references": ["<A@X>", "<a2@x>"]})
'a@x'
>>> conversation_key({"key": "acme/new@x", "message_id": "new@x", "references": []})
'new@x'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The Kafka header of a ``mail.events`` record that carries :func:`conversation_key` of its
#: event (UTF-8).
CONVERSATION_HEADER = "mailtap.conversation"


def normalized_message_id(value: str | None) -> str:
    """``<Abc@Example.COM>`` -> ``abc@example.com``; empty for None or blank."""
    return (value or "").strip().strip("<>").strip().lower()


def conversation_key(record: Mapping[str, Any]) -> str:
    """The conversation of a decoded ``MailEvent`` (the rule in the module docs)."""
    for candidate in (
        *(record.get("references") or ())[:1],
        record.get("in_reply_to"),
        record.get("message_id"),
    ):
        found = normalized_message_id(candidate)
        if found:
            return found
    return str(record.get("key") or "")
