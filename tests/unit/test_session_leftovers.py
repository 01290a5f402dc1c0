"""The end-of-session check that no process the test suite started outlives it.

``tests/support/leftovers.py``: processes carrying the session's ``MAILTAP_TEST_RUN`` id, and the
members of sessions they lead, are leftovers; kept services' groups are not.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from mailtap.dev import process
from tests.support import leftovers

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 60.0


def _marked_env(run_id: str) -> dict[str, str]:
    return {**os.environ, leftovers.RUN_ENV: run_id}


def test_a_leaked_process_is_named_with_its_command_line_until_it_is_gone() -> None:
    run_id = uuid.uuid4().hex
    leaked = subprocess.Popen(["sleep", "3601"], env=_marked_env(run_id))
    try:
        found = leftovers.find_leftovers(run_id)
        assert found == [leftovers.Leftover(leaked.pid, "sleep 3601")]
        assert f"pid {leaked.pid}: sleep 3601" in str(found[0])
        # Another run's id, or a kept group, is not this run's leftover.
        assert leftovers.find_leftovers(uuid.uuid4().hex) == []
        assert leftovers.find_leftovers(run_id, ignore_groups={os.getpgid(leaked.pid)}) == []
    finally:
        leaked.kill()
        leaked.wait(WAIT_S)
    assert leftovers.find_leftovers(run_id) == []


def test_children_that_clean_their_environment_are_found_through_their_session(
    tmp_path: Path,
) -> None:
    """Like Dovecot's children: started by a service in its own session, without the id."""
    run_id = uuid.uuid4().hex
    script = "import subprocess; subprocess.run(['env', '-i', 'sleep', '3602'])"
    leader = subprocess.Popen(
        [sys.executable, "-c", script], env=_marked_env(run_id), start_new_session=True
    )
    try:
        process.wait_until_ready(
            "child",
            leader.pid,
            lambda: _require(len(process.group_members(leader.pid)) == 2),
            [],
            WAIT_S,
        )
        (child,) = set(process.group_members(leader.pid)) - {leader.pid}
        assert leftovers.RUN_ENV.encode() not in Path(f"/proc/{child}/environ").read_bytes()
        found = {left.pid: left.cmdline for left in leftovers.find_leftovers(run_id)}
        assert found == {leader.pid: f"{sys.executable} -c {script}", child: "sleep 3602"}
    finally:
        process.stop_group(leader.pid)
        leader.wait(WAIT_S)


def _require(condition: bool) -> None:
    if not condition:
        raise RuntimeError("not yet")


LEAKING_TEST = """
import subprocess
from pathlib import Path


def test_leaks_a_sleep() -> None:
    leaked = subprocess.Popen(["sleep", "3603"])
    Path("{pid_file}").write_text(str(leaked.pid))
"""

CLEAN_TEST = """
import subprocess


def test_waits_for_its_sleep() -> None:
    subprocess.run(["sleep", "0.1"], check=True)
"""


def _pytest(test_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.leftovers", "-q", str(test_file)],
        cwd=test_file.parent,
        env={**os.environ, "PYTHONPATH": str(REPO), leftovers.GRACE_ENV: "1"},
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )


def test_a_session_that_leaks_a_process_fails_naming_it_and_the_process_is_killed(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "leaked.pid"
    test_file = tmp_path / "test_leaky.py"
    test_file.write_text(LEAKING_TEST.format(pid_file=pid_file))
    run = _pytest(test_file)
    leaked = int(pid_file.read_text())
    try:
        assert run.returncode == 1, run.stdout + run.stderr
        assert "1 passed" in run.stdout  # the test itself passed: the session check failed it
        assert "processes left behind" in run.stdout
        assert f"pid {leaked}: sleep 3603" in run.stdout
        assert not process.is_alive(leaked)
    finally:
        if process.is_alive(leaked):
            os.kill(leaked, 9)


KILLED_TEST = """
import subprocess
import time
from pathlib import Path


def test_is_killed_while_its_sleep_runs() -> None:
    started = subprocess.Popen(["sleep", "3605"])
    Path("{pid_file}").write_text(str(started.pid))
    time.sleep(600)
"""


def test_a_kill_9_of_the_session_kills_what_its_tests_started(tmp_path: Path) -> None:
    """A plain Popen of a test is tied to nothing: when pytest is killed, its reaper kills it."""
    pid_file = tmp_path / "started.pid"
    test_file = tmp_path / "test_killed.py"
    test_file.write_text(KILLED_TEST.format(pid_file=pid_file))
    inner = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "tests.support.leftovers", "-q", str(test_file)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    started = 0
    try:
        process.wait_until_ready(
            "inner pytest", inner.pid, lambda: _require(pid_file.exists()), [], WAIT_S
        )
        started = int(pid_file.read_text())
        assert process.is_alive(started)
        inner.kill()
        inner.wait(WAIT_S)
        deadline = time.monotonic() + WAIT_S
        while process.is_alive(started) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not process.is_alive(started)
    finally:
        if inner.poll() is None:
            inner.kill()
        if started and process.is_alive(started):
            os.kill(started, 9)


def test_a_session_that_leaks_nothing_passes(tmp_path: Path) -> None:
    test_file = tmp_path / "test_clean.py"
    test_file.write_text(CLEAN_TEST)
    run = _pytest(test_file)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "processes left behind" not in run.stdout


def test_a_child_of_the_pytest_process_without_the_id_is_found_as_a_descendant() -> None:
    """Dovecot writes its process titles over its environment: the id is gone from there."""
    child = subprocess.Popen(["env", "-i", "sleep", "3604"])
    try:
        assert child.pid not in {left.pid for left in leftovers.find_leftovers(uuid.uuid4().hex)}
        found = leftovers.find_leftovers(uuid.uuid4().hex, root_pid=os.getpid())
        assert child.pid in {left.pid for left in found}
    finally:
        child.kill()
        child.wait(WAIT_S)


def test_the_interpreters_multiprocessing_helper_is_not_a_leftover() -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # Only what this pool starts is judged here: an orphaned helper of an earlier test's child
    # (seen once in a full run) is the session-end check's to report, not this test's.
    before = {left.pid for left in leftovers.find_leftovers(uuid.uuid4().hex, root_pid=os.getpid())}
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        worker = pool.submit(os.getpid).result(WAIT_S)
    found = [
        left
        for left in leftovers.find_leftovers(uuid.uuid4().hex, root_pid=os.getpid())
        if left.pid not in before
    ]
    assert worker not in {left.pid for left in found}  # the pool's worker ended with it
    assert not [left for left in found if "resource_tracker" in left.cmdline]
