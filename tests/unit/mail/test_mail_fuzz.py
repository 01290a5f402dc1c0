"""Property tests: the pre-scan agrees with the stdlib parser on MIME structure, and no
input whatsoever makes parse_mail raise or produce an event outside the contract."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from email import policy
from email.message import Message
from email.parser import BytesParser
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.core.mail import ParsedMail, ParseLimits
from connectors.core.mail.limits import prescan

pytestmark = pytest.mark.unit

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "mail"

# A MIME tree: ("leaf", text) | ("multipart", subtype, [children]) | ("message", child)
_leaf = st.tuples(st.just("leaf"), st.sampled_from(["hi", "-- signature", "--not-a-boundary"]))
_tree = st.recursive(
    _leaf,
    lambda children: st.one_of(
        st.tuples(
            st.just("multipart"),
            st.sampled_from(["mixed", "alternative", "related"]),
            st.lists(children, min_size=1, max_size=3),
        ),
        st.tuples(st.just("message"), children),
    ),
    max_leaves=12,
)


def _render(node: Any, counter: itertools.count[int]) -> list[str]:
    """Header lines, an empty line and the body of one entity."""
    if node[0] == "leaf":
        return ["Content-Type: text/plain", "", node[1]]
    if node[0] == "message":
        return ["Content-Type: message/rfc822", "", "Subject: inner", *_render(node[1], counter)]
    boundary = f"b{next(counter)}"
    lines = [f'Content-Type: multipart/{node[1]}; boundary="{boundary}"', "", "preamble"]
    for child in node[2]:
        lines += [f"--{boundary}", *_render(child, counter)]
    return [*lines, f"--{boundary}--", "epilogue"]


def _depth(node: Any) -> int:
    if node[0] == "leaf":
        return 0
    if node[0] == "message":
        return 1 + _depth(node[1])
    return 1 + max(_depth(child) for child in node[2])


def _stdlib_depth(message: Message) -> int:
    payload = message.get_payload()
    if not isinstance(payload, list):
        return 0
    return 1 + max((_stdlib_depth(p) for p in payload if isinstance(p, Message)), default=0)


@settings(max_examples=300, deadline=None)
@given(tree=_tree, newline=st.sampled_from(["\r\n", "\n"]))
def test_prescan_depth_matches_the_stdlib_parser(tree: Any, newline: str) -> None:
    raw = newline.join(["Subject: fuzz", *_render(tree, itertools.count())]).encode() + b"\n"
    parsed = BytesParser(policy=policy.compat32).parsebytes(raw)
    assert _stdlib_depth(parsed) == _depth(tree)
    scan = prescan(raw, ParseLimits())
    assert scan.max_depth == _depth(tree)
    assert scan.patches == []


@settings(max_examples=300, deadline=None)
@given(tree=_tree, cap=st.integers(min_value=1, max_value=4))
def test_capped_trees_always_parse_within_the_cap(
    parse: Callable[..., ParsedMail], tree: Any, cap: int
) -> None:
    raw = "\r\n".join(["Subject: fuzz", *_render(tree, itertools.count())]).encode()
    mail = parse(raw, limits=ParseLimits(max_mime_depth=cap))
    assert mail.event["subject"] == "fuzz"
    flattened = _depth(tree) > cap
    assert (mail.parse_error is not None and "flattened" in mail.parse_error) == flattened


def _mutations() -> st.SearchStrategy[bytes]:
    seeds = [path.read_bytes() for path in sorted(CORPUS.glob("*.eml"))]

    @st.composite
    def mutate(draw: st.DrawFn) -> bytes:
        data = bytearray(draw(st.sampled_from(seeds)))
        for _ in range(draw(st.integers(min_value=1, max_value=8))):
            position = draw(st.integers(min_value=0, max_value=len(data)))
            action = draw(st.sampled_from(["insert", "delete", "flip"]))
            chunk = draw(
                st.sampled_from(
                    [
                        b"\r\n",
                        b"\n\n",
                        b"--",
                        b"=?",
                        b"?=",
                        b";",
                        b'"',
                        b"\x00",
                        b"\xff",
                        b"<",
                        b"(",
                    ]
                )
            )
            if action == "insert":
                data[position:position] = chunk
            elif action == "delete":
                del data[position : position + draw(st.integers(min_value=1, max_value=40))]
            elif position < len(data):
                data[position] ^= draw(st.integers(min_value=1, max_value=255))
        return bytes(data)

    return mutate()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.one_of(_mutations(), st.binary(max_size=2000)))
def test_any_input_gives_a_valid_event(parse: Callable[..., ParsedMail], raw: bytes) -> None:
    mail = parse(raw)  # the fixture validates the event against the Avro schema
    assert mail.event["size"] == len(raw)
    assert mail.key.startswith(("ops/mid:", "ops/fp:"))
