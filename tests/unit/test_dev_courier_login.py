"""The Courier login front end's pre-login parsing (mailtap/dev/courier_login.py): atoms,
quoted strings with escapes, and literals with their continuation."""

from __future__ import annotations

import socket

from mailtap.dev.courier_login import _arguments, _Reader


def test_atoms_and_quoted_strings_with_escapes() -> None:
    here, there = socket.socketpair()
    with here, there:
        args = _arguments(b'alice@example.com "se\\"c\\\\ret"', _Reader(here), here)
    assert args == [b"alice@example.com", b'se"c\\ret']


def test_a_literal_gets_a_continuation_and_is_read_exactly() -> None:
    here, there = socket.socketpair()
    with here, there:
        there.sendall(b'p{ss w"rd\r\n')
        args = _arguments(b"alice@example.com {9}", _Reader(here), here)
        assert there.recv(100) == b"+ OK\r\n"
    assert args == [b"alice@example.com", b'p{ss w"rd']
