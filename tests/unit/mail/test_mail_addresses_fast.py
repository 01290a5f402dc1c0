"""The fast path for plain addresses gives exactly what the strict stdlib-based parser gives."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.core.mail import addresses

pytestmark = pytest.mark.unit

NEVER = re.compile(r"(?!)")


def _slow(values: list[str], monkeypatch: pytest.MonkeyPatch) -> list[dict[str, str | None]]:
    with monkeypatch.context() as patched:
        patched.setattr(addresses, "_SIMPLE", NEVER)
        return addresses.parse_addresses(values)


_atom = st.text("abcXYZ019_+-", min_size=1, max_size=6)
_dot_atom = st.lists(_atom, min_size=1, max_size=3).map(".".join)
_spec = st.tuples(_dot_atom, _dot_atom).map("@".join)
_name = st.lists(_atom, min_size=1, max_size=3).map(" ".join)
_plain = st.one_of(_spec, st.tuples(_name, _spec).map(lambda p: f"{p[0]} <{p[1]}>"))
# Near misses: the plain shapes with a character from the grammar's edges spliced in.
_edge = st.sampled_from(list(" .@<>,\"()\\[];:'=?é\t"))
_near = st.tuples(_plain, st.integers(0, 40), _edge).map(
    lambda t: t[0][: t[1]] + t[2] + t[0][t[1] :]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_plain, _near), min_size=1, max_size=3))
def test_fast_and_strict_paths_agree(values: list[str]) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert addresses.parse_addresses(values) == _slow(values, monkeypatch)


@pytest.mark.parametrize(
    ("value", "fast"),
    [
        ("Sender 5 <sender5@example.com>", True),
        ("bench@example.com", True),
        ('"Lee, Ann" <ann@example.com>', False),
        ("alice@example.org <bob@example.com>", False),
        ("=?utf-8?q?J=C3=BCrgen?= <j@example.com>", False),
        ("ann@example.com (Ann)", False),
    ],
)
def test_which_values_take_the_fast_path(value: str, fast: bool) -> None:
    assert (addresses._SIMPLE.fullmatch(value) is not None) is fast
