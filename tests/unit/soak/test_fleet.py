"""The harness restarts an instance from two threads (the fault injector after its kill, the
supervisor after an exit it sees): one identity must never run twice. A soak once did: both saw
the same killed streams worker, both started it, and the untracked one ran on as a third worker."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from mailtap.soak.fleet import Instance


class Sleeper(Instance):
    def command(self) -> list[str]:
        # stands in for `mailtap run`: one process that runs until it is killed (the harness
        # appends `-c CONFIG`: the script's argv). Not `sh -c "sleep 60"`: a shell that forks
        # its sleep leaves it behind when PR_SET_PDEATHSIG ends the shell alone (the restarting
        # threads end), which a CI run's leftover check found (5 sleeps outlived the session).
        return [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_running_instance_is_not_started_again(tmp_path: Path) -> None:
    instance = Sleeper("streams-1", {}, tmp_path)
    try:
        instance.start()
        first = instance.proc
        instance.start()
        assert instance.proc is first
        assert instance.lives == 1
    finally:
        instance.kill()


def _restart_from_both_threads(instance: Instance) -> tuple[bool, int]:
    """The fault thread and the supervisor restart a killed instance at once: (alive, starts)."""
    before = instance.lives
    go = threading.Barrier(2)
    worked = threading.Barrier(3)
    # A child gets SIGKILL when the thread that started it ends (die_with_parent): the threads
    # stay until the instance has been looked at.
    done = threading.Event()

    def fault_restart() -> None:
        go.wait()
        if not instance.alive:
            instance.start()
        worked.wait()
        done.wait(30)

    def supervise() -> None:
        go.wait()
        for _ in range(200):
            if instance.exited_by_itself() is not None:
                instance.start()
        worked.wait()
        done.wait(30)

    threads = [threading.Thread(target=fault_restart), threading.Thread(target=supervise)]
    for t in threads:
        t.start()
    worked.wait(30)
    try:
        return instance.alive, instance.lives - before
    finally:
        done.set()
        for t in threads:
            t.join(30)


def test_the_fault_thread_and_the_supervisor_restart_a_killed_instance_once(
    tmp_path: Path,
) -> None:
    instance = Sleeper("streams-1", {}, tmp_path)
    try:
        for _ in range(20):
            instance.start()
            instance.kill()
            assert instance.exited_by_itself() is None  # killed on purpose: not a crash
            assert _restart_from_both_threads(instance) == (True, 1)
    finally:
        instance.kill()
