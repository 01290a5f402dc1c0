"""UID sets as ranges, so a folder's UIDs take memory by their gaps, not by their number.

A first sync of a folder of a million mails, and every expunge check, asks the server for all
its UIDs. As a list of ints that is ~36 MB while it lives (and pymalloc keeps the peak); as the
ranges of an ESEARCH answer (RFC 4731, ``* ESEARCH (TAG "A5") UID ALL 1:999990,999995``) it is
a few tuples. :class:`UidSet` is that answer: an immutable, ascending sequence of UIDs stored as
ranges, read lazily (iteration, slices, ``in`` by bisection).

>>> uids = UidSet.parse(b"1:3,7,10:11")
>>> len(uids), list(uids), uids[0], uids[-1], 7 in uids, 8 in uids
(6, [1, 2, 3, 7, 10, 11], 1, 11, True, False)
>>> uids[2:5], uids.from_uid(8).ranges
([3, 7, 10], ((10, 11),))
>>> UidSet.from_uids([5, 3, 4, 9]).ranges
((3, 5), (9, 9))
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import overload


class UidSet(Sequence[int]):
    """Ascending distinct UIDs, kept as merged inclusive ranges."""

    __slots__ = ("_ends", "_offsets", "_starts")

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        merged: list[list[int]] = []
        for low, high in sorted(ranges):
            if low < 1 or high < low:
                raise ValueError(f"not a UID range: {low}:{high}")
            if merged and low <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], high)
            else:
                merged.append([low, high])
        self._starts = [low for low, _ in merged]
        self._ends = [high for _, high in merged]
        #: How many UIDs come before each range: index -> UID by bisection.
        self._offsets = list(
            itertools.accumulate((high - low + 1 for low, high in merged), initial=0)
        )

    @classmethod
    def from_uids(cls, uids: Iterable[int]) -> UidSet:
        """From single UIDs (a plain SEARCH answer), in any order, duplicates allowed."""
        ranges: list[tuple[int, int]] = []
        for uid in sorted(set(uids)):
            if ranges and uid == ranges[-1][1] + 1:
                ranges[-1] = (ranges[-1][0], uid)
            else:
                ranges.append((uid, uid))
        return cls(ranges)

    @classmethod
    def parse(cls, sequence_set: bytes | str) -> UidSet:
        """An IMAP sequence set of UIDs (RFC 3501 ``sequence-set``, without ``*``)."""
        text = sequence_set.decode("ascii") if isinstance(sequence_set, bytes) else sequence_set
        ranges = []
        for part in text.split(","):
            low, colon, high = part.partition(":")
            if not low.isdigit() or (colon and not high.isdigit()):
                raise ValueError(f"not a UID sequence set: {text[:80]!r}")
            a, b = int(low), int(high or low)
            ranges.append((min(a, b), max(a, b)))  # "5:3" is 3:5 (RFC 3501 seq-range)
        return cls(ranges)

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self._starts, self._ends, strict=True))

    def from_uid(self, first: int) -> UidSet:
        """The UIDs >= ``first``."""
        return self.between(first, self._ends[-1] if self._ends else first)

    def between(self, first: int, last: int) -> UidSet:
        """The UIDs in ``first..last``.

        >>> UidSet.parse("1:5,9,12:20").between(3, 14).ranges
        ((3, 5), (9, 9), (12, 14))
        """
        return UidSet(
            (max(low, first), min(high, last))
            for low, high in self.ranges
            if high >= first and low <= last
        )

    def __len__(self) -> int:
        return self._offsets[-1]

    def __iter__(self) -> Iterator[int]:
        for low, high in zip(self._starts, self._ends, strict=True):
            yield from range(low, high + 1)

    def __contains__(self, uid: object) -> bool:
        if not isinstance(uid, int):
            return False
        at = bisect.bisect_right(self._starts, uid) - 1
        return at >= 0 and uid <= self._ends[at]

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return self._slice(start, stop)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("UidSet index out of range")
        at = bisect.bisect_right(self._offsets, index) - 1
        return self._starts[at] + index - self._offsets[at]

    def _slice(self, start: int, stop: int) -> list[int]:
        """The UIDs at positions ``start..stop-1``, built range by range (no per-UID loop)."""
        found: list[int] = []
        at = bisect.bisect_right(self._offsets, start) - 1
        while start < stop and at < len(self._starts):
            offset, low = self._offsets[at], self._starts[at]
            found.extend(
                range(low + max(start - offset, 0), low + min(stop, self._offsets[at + 1]) - offset)
            )
            at += 1
            start = self._offsets[at]
        return found

    def __eq__(self, other: object) -> bool:
        if isinstance(other, UidSet):
            return self.ranges == other.ranges
        if isinstance(other, Sequence):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.ranges)

    def __repr__(self) -> str:
        shown = ",".join(f"{a}" if a == b else f"{a}:{b}" for a, b in self.ranges[:8])
        more = ",..." if len(self._starts) > 8 else ""
        return f"UidSet({shown}{more}; {len(self)} uids)"


def parse_esearch(lines: Sequence[bytes | None]) -> UidSet:
    """The UIDs of one ``ESEARCH`` answer to ``UID SEARCH RETURN (ALL) ...`` (RFC 4731).

    ``(TAG "A5") UID ALL 1:3,7`` -> 1,2,3,7; no ``ALL`` (``(TAG "A5") UID``) -> nothing matched.

    >>> parse_esearch([b'(TAG "A5") UID ALL 1:3,7']).ranges
    ((1, 3), (7, 7))
    >>> len(parse_esearch([b'(TAG "A5") UID']))
    0
    """
    answers = [line for line in lines if line]
    if len(answers) != 1:
        # Never "nothing matched" by default: an expunge check would take every mail as gone.
        raise ValueError(f"expected one ESEARCH answer, got {len(answers)}: {answers[:2]!r}")
    tokens = answers[0].split()
    for name, value in itertools.pairwise(tokens):
        if name.upper() == b"ALL":
            return UidSet.parse(value)
    return UidSet()
