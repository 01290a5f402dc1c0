"""The worker's state machine: the diagram is enforced and every transition is logged once."""

from __future__ import annotations

import logging

import pytest

from connectors.imap.state import IllegalTransition, StateMachine, WorkerState

S = WorkerState


def test_happy_path_and_the_wait_sync_cycle() -> None:
    machine = StateMachine("acct", "INBOX")
    for state in (
        S.CONNECTING,
        S.AUTHENTICATING,
        S.SELECTING,
        S.SYNCING,
        S.IDLE,
        S.SYNCING,
        S.POLLING,
    ):
        machine.to(state)
    assert machine.history[0] is S.DISCONNECTED and machine.state is S.POLLING


@pytest.mark.parametrize("state", [s for s in S if s is not S.STOPPED])
def test_any_state_may_fail_into_backoff_and_backoff_only_reconnects(state: WorkerState) -> None:
    machine = StateMachine("acct", "INBOX")
    machine.state = state
    machine.to(S.BACKOFF)
    with pytest.raises(IllegalTransition):
        machine.to(S.SYNCING)
    machine.to(S.CONNECTING)


def test_skipping_a_step_is_a_bug() -> None:
    machine = StateMachine("acct", "INBOX")
    with pytest.raises(IllegalTransition):
        machine.to(S.SYNCING)
    machine.to(S.STOPPED)
    with pytest.raises(IllegalTransition):
        machine.to(S.CONNECTING)


def test_one_log_line_per_transition_with_account_and_folder(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="connectors.imap.state")
    machine = StateMachine("acct", "Sent")
    machine.to(S.CONNECTING)
    machine.to(S.CONNECTING)  # not a transition: no line
    machine.to(S.BACKOFF, "timeout")
    lines = [r for r in caplog.records if r.name == "connectors.imap.state"]
    assert [r.getMessage() for r in lines] == [
        "imap acct/Sent: DISCONNECTED -> CONNECTING",
        "imap acct/Sent: CONNECTING -> BACKOFF (timeout)",
    ]
    assert lines[1].levelno == logging.WARNING
    assert all(r.account == "acct" and r.folder == "Sent" for r in lines)


def test_caught_up_is_an_info_line_the_later_cycles_are_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # README: -v (INFO) shows one line per transition; "caught up" must be one of them.
    caplog.set_level(logging.DEBUG, logger="connectors.imap.state")
    machine = StateMachine("acct", "INBOX")
    for state in (
        S.CONNECTING,
        S.AUTHENTICATING,
        S.SELECTING,
        S.SYNCING,
        S.IDLE,
        S.SYNCING,
        S.IDLE,
    ):
        machine.to(state)
    idle = [r for r in caplog.records if r.getMessage().endswith(("-> IDLE", "(caught up)"))]
    assert [(r.levelno, r.getMessage()) for r in idle] == [
        (logging.INFO, "imap acct/INBOX: SYNCING -> IDLE (caught up)"),
        (logging.DEBUG, "imap acct/INBOX: SYNCING -> IDLE"),
    ]
