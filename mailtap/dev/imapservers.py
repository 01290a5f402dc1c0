"""The IMAP servers of the dev stack, behind one small interface: start one, add accounts.

``mailtap dev up --imap KIND`` and the server-matrix tests use it; mail goes in over IMAP
(APPEND) the same way on every kind, so nothing else needs to know which server runs.

============== ============================================================================
kind           what it stands for
============== ============================================================================
dovecot        Dovecot 2.3: IDLE, CONDSTORE, QRESYNC, MOVE, UIDPLUS, ESEARCH (the default)
dovecot-minimal Dovecot with ``imap_capability = IMAP4rev1 UIDPLUS``: the bare RFC 3501
               minimum of appliances and old servers (no IDLE, CONDSTORE, QRESYNC, MOVE, ESEARCH)
cyrus          Cyrus IMAP 3.6: the same extensions as Dovecot, another implementation
courier        Courier-IMAP 5: IDLE (polled by the server), UIDPLUS; no CONDSTORE, QRESYNC,
               MOVE, ESEARCH (hosting providers)
greenmail      GreenMail 2.1, in memory: IDLE, MOVE, UIDPLUS; no CONDSTORE, QRESYNC, ESEARCH
               (the server Java teams test against; ``make greenmail`` resolves it)
============== ============================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from mailtap.dev import courier, cyrus, dovecot, greenmail, process

ImapKind = Literal["dovecot", "dovecot-minimal", "cyrus", "courier", "greenmail"]
KINDS: tuple[ImapKind, ...] = get_args(ImapKind)


@dataclass(frozen=True)
class StartedImap:
    """A started IMAP server: ``root`` is where its config, accounts and mail live."""

    kind: str
    pid: int
    root: Path
    log_path: Path
    config_path: Path
    #: Every account with its password (Dovecot's passwd-file format, whatever the kind).
    passwd_file: Path
    mail_dir: Path


def check_kind(kind: str) -> ImapKind:
    if kind not in KINDS:
        raise ValueError(f"unknown IMAP server {kind!r}: choose one of {', '.join(KINDS)}")
    return kind


def launch(kind: str, state_dir: Path, host: str, port: int) -> StartedImap:
    """Write the server's config under ``state_dir`` and start it (not waiting for it)."""
    check_kind(kind)
    if kind in ("dovecot", "dovecot-minimal"):
        dc = dovecot.layout_for(state_dir)
        dovecot.render(dc, host, port, minimal=kind == "dovecot-minimal")
        pid = dovecot.start(dc)
        return StartedImap(kind, pid, dc.root, dc.log, dc.config, dc.passwd_file, dc.mail_dir)
    if kind == "cyrus":
        cy = cyrus.layout_for(state_dir)
        cyrus.render(cy, host, port)
        pid = cyrus.start(cy)
        return StartedImap(kind, pid, cy.root, cy.log, cy.config, cy.accounts_file, cy.mail_dir)
    if kind == "greenmail":
        gm = greenmail.layout_for(state_dir)
        greenmail.render(gm, host, port)
        pid = greenmail.start(gm)
        return StartedImap(kind, pid, gm.root, gm.log, gm.config, gm.accounts_file, gm.mail_dir)
    co = courier.layout_for(state_dir)
    courier.render(co, host, port)
    pid = courier.start(co)
    return StartedImap(kind, pid, co.root, co.log, co.config, co.accounts_file, co.mail_dir)


def wait_ready(started: StartedImap, host: str, port: int) -> None:
    if started.kind == "cyrus":
        cyrus.wait_ready(cyrus.CyrusLayout(started.root), started.pid, host, port)
    elif started.kind == "courier":
        courier.wait_ready(courier.CourierLayout(started.root), started.pid, host, port)
    elif started.kind == "greenmail":
        greenmail.wait_ready(greenmail.GreenMailLayout(started.root), started.pid, host, port)
    else:
        dovecot.wait_ready(dovecot.DovecotLayout(started.root), started.pid, host, port)


def start(kind: str, state_dir: Path, host: str, port: int | None = None) -> StartedImap:
    """:func:`launch` on ``port`` (a free one by default) and wait until it accepts a LOGIN."""
    port = port or process.free_port(host)
    started = launch(kind, state_dir, host, port)
    try:
        wait_ready(started, host, port)
    except BaseException:
        process.stop_group(started.pid)
        raise
    return started


def add_users(kind: str, root: Path, accounts: list[tuple[str, str]]) -> None:
    """Create (or replace) accounts on the server of ``kind`` living in ``root``; each can log
    in when this returns."""
    check_kind(kind)
    if kind == "cyrus":
        cyrus.add_users(cyrus.CyrusLayout(root), accounts)
    elif kind == "courier":
        courier.add_users(courier.CourierLayout(root), accounts)
    elif kind == "greenmail":
        greenmail.add_users(greenmail.GreenMailLayout(root), accounts)
    else:
        dovecot.add_users(dovecot.DovecotLayout(root).passwd_file, accounts)
