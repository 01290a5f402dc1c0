"""The console's tokens file: what a bad one says, a rotated one re-read, constant-time lookup,
and the CSRF token derived from a login."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from connectors.core.errors import ConfigError
from mailtap.console.tokens import Principal, TokenBook, csrf_token, parse_tokens

OPERATOR = "o" * 30
VIEWER = "v" * 30


def write(path: Path, entries: list[dict[str, str]]) -> Path:
    path.write_text(yaml.safe_dump(entries))
    return path


def test_lookup_gives_the_principal_of_a_token_and_none_for_others(tmp_path: Path) -> None:
    book = TokenBook(
        write(
            tmp_path / "t.yaml",
            [
                {"name": "olga", "role": "operator", "token": OPERATOR},
                {"name": "victor", "role": "viewer", "token": VIEWER},
            ],
        )
    )
    assert book.lookup(OPERATOR) == Principal("olga", "operator")
    assert book.lookup(VIEWER) == Principal("victor", "viewer")
    assert book.lookup(VIEWER).may_act is False  # type: ignore[union-attr]
    for wrong in (None, "", OPERATOR[:-1], OPERATOR + "x", "olga"):
        assert book.lookup(wrong) is None


def test_a_rotated_file_is_read_again_and_a_broken_rotation_keeps_the_last_tokens(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "t.yaml", [{"name": "a", "role": "viewer", "token": VIEWER}])
    book = TokenBook(path)
    write(path, [{"name": "b", "role": "operator", "token": OPERATOR}])
    os.utime(path, ns=(1, 10**18))  # a new mtime even within the same clock tick
    assert book.lookup(VIEWER) is None
    assert book.lookup(OPERATOR) == Principal("b", "operator")
    path.write_text("- not: [valid")
    os.utime(path, ns=(1, 2 * 10**18))
    assert book.lookup(OPERATOR) == Principal("b", "operator")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "expected a list"),
        ("- {name: a, role: admin, token: " + "x" * 30 + "}", "role must be viewer or operator"),
        ("- {name: a, role: viewer, token: short}", "shorter than 24 characters"),
        ("- {name: a, role: viewer}", "exactly name, role and token"),
        (
            "- {name: a, role: viewer, token: " + "x" * 30 + "}\n"
            "- {name: a, role: operator, token: " + "y" * 30 + "}",
            "given twice",
        ),
        ("- [a: b", "not valid YAML"),
    ],
)
def test_a_bad_tokens_file_says_what_to_change(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_tokens(text, "tokens.yaml")


def test_a_missing_tokens_file_fails_the_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"console.tokens_file .* cannot be read"):
        TokenBook(tmp_path / "absent.yaml")


def test_the_csrf_token_is_bound_to_the_login_and_reveals_nothing_of_it() -> None:
    first, second = csrf_token(OPERATOR), csrf_token(VIEWER)
    assert first == csrf_token(OPERATOR) and first != second
    assert OPERATOR not in first and len(first) == 64
