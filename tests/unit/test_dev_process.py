"""mailtap.dev.process: start-up failures quote the log; stopping reaches the whole group."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mailtap.dev import process
from mailtap.dev.errors import ServiceStartError


@pytest.fixture
def untied(monkeypatch: pytest.MonkeyPatch) -> None:
    """`spawn` starts the service itself, as `mailtap dev up` does, not under the group guard a
    tied test session adds (CI ties the session before these tests run): a test that counts a
    service's group members or CPU sees only the service and what it forks."""
    monkeypatch.setattr(process, "_tied", False)


def test_free_port_is_bindable() -> None:
    port = process.free_port()
    assert 1024 < port < 65536
    assert process.port_is_free(port)


def test_a_server_port_is_not_one_an_outgoing_connection_could_take() -> None:
    # Between the pick and a server's bind, clients' connections take ephemeral ports: a
    # component in a container would lose its health port to one (EADDRINUSE, a restart).
    first = process._ephemeral_start()
    ports = process.free_ports(50)
    assert all(process.LOWEST_SERVER_PORT <= port < first for port in ports)


def test_reserved_ports_are_distinct_and_held_until_the_block_ends() -> None:
    with process.reserved_ports(40) as ports:
        assert len(set(ports)) == 40
        # Held: no server and no bind(0) of ours can take one meanwhile.
        assert not any(process.port_is_free(port) for port in ports)
        taken = {process.free_port() for _ in range(200)}
        assert not taken & set(ports)
    assert all(process.port_is_free(port) for port in ports)


def test_log_tail_keeps_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "service.log"
    log.write_text("".join(f"line {i}\n" for i in range(50)))
    assert process.log_tail(log, 3) == "line 47\nline 48\nline 49"
    assert "no log" in process.log_tail(tmp_path / "missing.log")


def test_a_process_that_dies_fails_start_up_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "crash.log"
    pid = process.spawn(["sh", "-c", "echo 'fatal: port in use' >&2; exit 3"], log)

    def never_ready() -> None:
        raise ConnectionRefusedError

    with pytest.raises(ServiceStartError) as failure:
        process.wait_until_ready("crashy", pid, never_ready, [log], timeout=30)
    message = str(failure.value)
    assert "crashy did not start" in message
    assert f"process {pid} exited" in message
    assert "fatal: port in use" in message


def _refuse() -> None:
    raise OSError("refused")


def test_a_silent_process_times_out_naming_the_last_error(tmp_path: Path) -> None:
    log = tmp_path / "silent.log"
    pid = process.spawn(["sleep", "30"], log)
    try:
        with pytest.raises(ServiceStartError, match=r"no answer within 0 s.*refused"):
            process.wait_until_ready("silent", pid, _refuse, [log], 0.2)
    finally:
        process.stop_group(pid)


def test_ready_when_the_probe_answers_and_the_process_lives(tmp_path: Path) -> None:
    pid = process.spawn(["sleep", "30"], tmp_path / "ok.log")
    try:
        process.wait_until_ready("ok", pid, lambda: None, [], timeout=5)
    finally:
        process.stop_group(pid)


def test_stop_group_stops_children_and_escalates_to_sigkill(tmp_path: Path, untied: None) -> None:
    # The parent ignores SIGTERM, and so does its child (ignored signals survive exec):
    # only SIGKILL of the whole group ends both. Untied, its group is exactly the two of them.
    script = (
        "import signal, subprocess, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "subprocess.Popen(['sleep', '60'])\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    log = tmp_path / "stubborn.log"
    pid = process.spawn([sys.executable, "-c", script], log)

    def child_started() -> None:
        if len(process.group_members(pid)) != 2:
            raise RuntimeError("child not yet started")

    process.wait_until_ready("stubborn", pid, child_started, [log], timeout=30)
    assert process.stop_group(pid, timeout=0.5) is True
    assert process.group_members(pid) == []
    assert not process.is_alive(pid)
    assert process.stop_group(pid) is False


def test_stop_group_leaves_a_reused_pid_alone(tmp_path: Path) -> None:
    pid = process.spawn(["sleep", "30"], tmp_path / "other.log")
    try:
        started = process.start_time(pid)
        assert started is not None
        assert process.stop_group(pid, expected_start=started + 1) is False
        assert process.is_alive(pid)
        assert process.stop_group(pid, expected_start=started) is True
        assert not process.is_alive(pid)
    finally:
        process.stop_group(pid)


#: Burns half a second of CPU, then (as a decoy) stays alive.
_BURN = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end:\n    pass\n"


def test_group_cpu_keeps_what_exited_children_used_and_counts_no_other_group(
    tmp_path: Path, untied: None
) -> None:
    script = (
        "import subprocess, sys, time\n"
        f"subprocess.run([sys.executable, '-c', {_BURN!r}], check=True)\n"
        "print('child done', flush=True)\n"
        "time.sleep(60)\n"
    )
    log = tmp_path / "service.log"
    pid = process.spawn([sys.executable, "-c", script], log)
    # The same command line in another group: a stranger's service of the same name.
    decoy = process.spawn([sys.executable, "-c", _BURN + "time.sleep(60)\n"], tmp_path / "d.log")
    try:

        def child_done() -> None:
            if "child done" not in log.read_text():
                raise RuntimeError("child still burning")

        process.wait_until_ready("burner", pid, child_done, [log], timeout=60)
        process.wait_until_ready(
            "decoy", decoy, lambda: _require(process.cpu_seconds(decoy) >= 0.5), [], timeout=60
        )
        # The child is gone, its CPU lives on in its parent's reaped-children counters.
        assert process.group_members(pid) == [pid]
        assert process.cpu_seconds(pid) < 0.5
        assert process.group_cpu_seconds(pid) >= 0.5
        # Exactly the group's one live member and what it reaped: nothing of the decoy.
        assert process.group_cpu_seconds(pid) == process.cpu_seconds(pid, reaped_children=True)
    finally:
        process.stop_group(pid)
        process.stop_group(decoy)


def _require(condition: bool) -> None:
    if not condition:
        raise RuntimeError("not yet")


_STARTER = """
import sys, time
from pathlib import Path
from mailtap.dev import process
if sys.argv[1] == "tied":
    process.tie_services_to_this_process()
# The service forks a server of its own that does not watch it (as Cyrus's master does).
forks = f"sleep 600 & echo $! > {sys.argv[3]}; sleep 600"
print(process.spawn(["/bin/sh", "-c", forks], Path(sys.argv[2])), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_a_tied_service_ends_with_a_kill_9_of_the_process_that_started_it(
    tmp_path: Path, tied: bool
) -> None:
    """A test session's services die with it, with the processes they forked (PR_SET_PDEATHSIG
    and the group guard); `mailtap dev up`'s outlive it."""
    import os
    import signal
    import subprocess
    import time

    starter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _STARTER,
            "tied" if tied else "untied",
            str(tmp_path / "s.log"),
            str(tmp_path / "forked.pid"),
        ],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert starter.stdout is not None
    service = int(starter.stdout.readline())
    pid_file = tmp_path / "forked.pid"
    deadline = time.monotonic() + 10
    while not pid_file.read_text().strip() if pid_file.exists() else True:
        assert time.monotonic() < deadline, "the service did not fork"
        time.sleep(0.05)
    forked = int(pid_file.read_text())
    try:
        assert process.is_alive(service) and process.is_alive(forked)
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait()
        deadline = time.monotonic() + 10
        while (process.is_alive(service) or process.is_alive(forked)) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert process.is_alive(service) is not tied
        assert process.is_alive(forked) is not tied
    finally:
        process.stop_group(service)
