"""Records the re-keying decoded, handed to the conversation agent of the same worker.

Why: both steps of :mod:`streams.app` may need the decoded ``MailEvent`` (the re-keying for
the conversation key of a record without the ``mailtap.conversation`` header, the agent for
everything), and Avro decoding took ~8 % of a worker's CPU
each time (py-spy, ``mailtap bench streams``, issue 29). The conversation agent reads the very
bytes the first one forwarded, usually moments later and in the same process, so it takes the
decoded record from here instead of decoding it again.

Bounded and first-in first-out: a record whose conversation partition another worker owns is
never taken here and ages out; a miss only costs the decode it saves. Each record is taken
once (``take`` removes it), so no two callers share one mutable dict.

>>> handoff = DecodedRecords(capacity=2)
>>> handoff.put(b"a", {"key": "a"}); handoff.put(b"b", {"key": "b"}); handoff.put(b"c", {"key": "c"})
>>> handoff.take(b"a") is None, handoff.take(b"c")
(True, {'key': 'c'})
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

#: ~2 x 5 KB per entry (the value and its decoded dict): a few MB at most. Enough for the
#: records in flight between the two agents of one worker when it keeps up with its input.
HANDOFF_CAPACITY = 512


class DecodedRecords:
    """Decoded records keyed by their encoded value, oldest dropped first."""

    def __init__(self, capacity: int = HANDOFF_CAPACITY) -> None:
        self._capacity = capacity
        self._records: OrderedDict[bytes, dict[str, Any]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def put(self, value: bytes, record: dict[str, Any]) -> None:
        self._records[value] = record
        if len(self._records) > self._capacity:
            self._records.popitem(last=False)

    def take(self, value: bytes) -> dict[str, Any] | None:
        """The record decoded from ``value``, removed; None when it is not here."""
        record = self._records.pop(value, None)
        if record is None:
            self.misses += 1
        else:
            self.hits += 1
        return record

    def __len__(self) -> int:
        return len(self._records)
