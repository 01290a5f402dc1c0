"""UidSet: a folder's UIDs as ranges; it must behave exactly like the sorted list of them."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.imap import uidset
from connectors.imap.uidset import UidSet, parse_esearch

uid_lists = st.lists(st.integers(min_value=1, max_value=400), max_size=120)


def test_doctests() -> None:
    result = doctest.testmod(uidset)
    assert result.attempted > 0 and result.failed == 0


@given(uid_lists)
def test_a_uid_set_reads_like_the_sorted_list_of_its_uids(uids: list[int]) -> None:
    expected = sorted(set(uids))
    found = UidSet.from_uids(uids)
    assert list(found) == expected and len(found) == len(expected)
    assert found == expected
    for i in range(-len(expected), len(expected)):
        assert found[i] == expected[i]
    for probe in range(0, 402):
        assert (probe in found) == (probe in expected)
    # Slices are what chunks() takes: every window and step.
    for start in range(0, len(expected) + 2, 7):
        for stop in (start, start + 1, start + 50, len(expected) + 3):
            assert found[start:stop] == expected[start:stop]
    assert found[::3] == expected[::3]
    assert found[-5:] == expected[-5:]


@given(uid_lists, st.integers(min_value=0, max_value=402))
def test_from_uid_keeps_the_uids_at_or_above(uids: list[int], first: int) -> None:
    assert list(UidSet.from_uids(uids).from_uid(first)) == sorted(
        u for u in set(uids) if u >= first
    )


@given(uid_lists)
def test_the_sequence_set_text_round_trips(uids: list[int]) -> None:
    found = UidSet.from_uids(uids)
    if found:
        text = ",".join(f"{a}:{b}" if a != b else str(a) for a, b in found.ranges)
        assert UidSet.parse(text) == found
        # Ranges the server merged differently, reversed or overlapping, mean the same UIDs.
        assert UidSet.parse(f"{text},{found[0]}") == found


def test_reversed_and_overlapping_ranges_are_normalized() -> None:
    assert UidSet.parse(b"5:3,4:9,11").ranges == ((3, 9), (11, 11))


@pytest.mark.parametrize("text", ["", "1:*", "a", "3:", "0", "1,,2", "-1"])
def test_what_is_not_a_uid_sequence_set_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        UidSet.parse(text)


def test_out_of_range_index_raises() -> None:
    with pytest.raises(IndexError):
        UidSet.parse("1:3")[3]
    with pytest.raises(IndexError):
        UidSet()[0]


def test_esearch_answers() -> None:
    assert parse_esearch([b'(TAG "A5") UID ALL 1:3,7']) == [1, 2, 3, 7]
    assert parse_esearch([b'(TAG "A5") UID COUNT 4 ALL 1:3,7']) == [1, 2, 3, 7]
    assert len(parse_esearch([None, b'(TAG "A5") UID'])) == 0


@pytest.mark.parametrize("lines", [[], [None], [b'(TAG "A5") UID ALL 1', b'(TAG "A6") UID ALL 2']])
def test_a_missing_or_doubled_esearch_answer_is_an_error_not_an_empty_folder(
    lines: list[bytes | None],
) -> None:
    # Taken as "no UIDs", an expunge check would tombstone every mail of the folder.
    with pytest.raises(ValueError, match="one ESEARCH answer"):
        parse_esearch(lines)
