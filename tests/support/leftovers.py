"""No process the test suite starts may outlive it (issue 16): a pytest plugin and its checker.

At session start the plugin puts ``MAILTAP_TEST_RUN=<new id>`` into ``os.environ``, so every
process started during the session inherits it (a subprocess, a service ``mailtap.dev`` spawns, a
source under test). At session end — after the session's fixtures have stopped the services —
these are leftovers:

- every live process that still carries the id (found wherever it was re-parented to);
- every live descendant of the pytest process: Dovecot writes its process titles over its
  environment block, so its master no longer shows the id;
- every process in a session that one of those leads (``start_new_session``): the children of a
  service that cleans their environment (Dovecot's ``imap``, ``auth``...).

The run fails, naming each leftover (pid, command line), and the leftovers are killed, so one
failed run does not pile up on the next. The pytest process itself never counts. Not seen: a
process that both lost the id (a cleaned or overwritten environment) and left the pytest
process's tree and sessions (re-parented after its starter exited).

When the pytest process dies without reaching the session's end (a kill -9, a CI timeout), a
reaper it started at session start (its own process, in its own session, reading a pipe only
pytest writes to) sees the pipe's end of file and kills this run's processes the same way:
those a test started with a plain ``subprocess.Popen``, which nothing else ties to pytest.

Containers are not processes of the session: podman's ``conmon`` runs them outside its process
groups, so a kill -9 of pytest left the deploy tests' containers running. Every container the
suite starts carries the annotation ``mailtap.test-run=<id>`` (``tests/deploy/conftest.py``
writes it, with the id in the containers' environment, into the session's containers.conf); at
the session's end a container still there is a leftover (removed, and the run fails), and the
reaper removes this run's containers (a pod with its pod) before it kills the processes.

Services kept on purpose between runs (``MAILTAP_TEST_STATE_DIR``) are excluded by their process
groups (:func:`keep`); those started by an earlier run do not carry this run's id at all. A
service the suite started and did not keep is checked like everything else.

``tests/conftest.py`` loads this plugin; ``pytest -p tests.support.leftovers`` loads it anywhere.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

RUN_ENV = "MAILTAP_TEST_RUN"
#: The annotation that marks a container of the run (see the module docstring).
CONTAINER_ANNOTATION = "mailtap.test-run"
#: podman's commands here: inspecting, or removing a container at once (no stop timeout).
PODMAN_TIMEOUT_S = 120.0
#: Processes the teardown has just signalled may still be exiting: wait this long at most for
#: them to go before calling them leftovers (the check ends as soon as none is left).
GRACE_S = 10.0
#: Overrides GRACE_S (the checker's own tests, which leak on purpose, need not wait that long).
GRACE_ENV = "MAILTAP_TEST_LEFTOVER_GRACE_S"

#: Process groups of services kept on purpose after the session (see keep()).
_kept_groups: set[int] = set()
#: The reaper (see the module docstring) and the file it reads the kept groups from.
_reaper: subprocess.Popen[bytes] | None = None
_kept_file: Path | None = None
#: What pytest writes to the reaper at a normal session end: nothing to reap.
_DONE = b"done"
_REAPER = """
import sys
sys.path.insert(0, sys.argv[3])
from tests.support import leftovers
leftovers.reap_when_orphaned(sys.argv[1], sys.argv[2])
"""
#: Helpers Python's multiprocessing starts once per interpreter (the "spawn" context of the IMAP
#: parse processes starts the resource tracker) and ends when the interpreter exits: a child of
#: the pytest process running one of these is not a leftover.
_INTERPRETER_HELPERS = (
    "from multiprocessing.resource_tracker import main",
    "from multiprocessing.forkserver import main",
)


@dataclass(frozen=True)
class Leftover:
    pid: int
    cmdline: str

    def __str__(self) -> str:
        return f"pid {self.pid}: {self.cmdline}"


@dataclass(frozen=True)
class Container:
    id: str
    name: str
    pod: str  # the pod's id, or empty

    def __str__(self) -> str:
        return (
            f"container {self.name} ({self.id[:12]}{', pod ' + self.pod[:12] if self.pod else ''})"
        )


@dataclass(frozen=True)
class _Stat:
    state: str
    ppid: int
    pgrp: int
    session: int


def keep(pgids: Iterable[int]) -> None:
    """Exclude these process groups from the check: services kept running on purpose."""
    _kept_groups.update(pgids)
    _write_kept()


def _write_kept() -> None:
    """The kept groups where the reaper reads them."""
    if _kept_file is not None:
        _kept_file.write_text(" ".join(str(pgid) for pgid in sorted(_kept_groups)))


def _stat(pid: int) -> _Stat | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # After the parenthesised command name: state, ppid, pgrp, session (proc(5) fields 3-6).
    fields = text.rsplit(")", 1)[1].split()
    return _Stat(fields[0], int(fields[1]), int(fields[2]), int(fields[3]))


def _carries(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or not ours to read
        return False


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip() or "?"


def _descendants(live: dict[int, _Stat], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, stat in live.items():
        children.setdefault(stat.ppid, []).append(pid)
    found: set[int] = set()
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def find_leftovers(
    run_id: str,
    *,
    root_pid: int | None = None,
    ignore_pids: Iterable[int] = (),
    ignore_groups: Iterable[int] = (),
) -> list[Leftover]:
    """Live processes of run ``run_id``: those carrying ``MAILTAP_TEST_RUN=<run_id>``, the
    descendants of ``root_pid`` (the pytest process), and every member of a session one of them
    leads; minus ``ignore_pids`` and ``ignore_groups``."""
    marker = f"{RUN_ENV}={run_id}".encode()
    stats = {
        int(entry.name): stat
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None
    }
    live = {pid: stat for pid, stat in stats.items() if stat.state not in ("Z", "X")}
    ours = {pid for pid in live if _carries(pid, marker)}
    if root_pid is not None:
        ours |= _descendants(live, root_pid)
    led = {live[pid].session for pid in ours if live[pid].session == pid}
    found = ours | {pid for pid, stat in live.items() if stat.session in led}
    skip_pids, skip_groups = set(ignore_pids), set(ignore_groups)
    leftovers = [
        Leftover(pid, _cmdline(pid))
        for pid in sorted(found)
        if pid not in skip_pids and live[pid].pgrp not in skip_groups
    ]
    return [left for left in leftovers if not _interpreter_helper(left, live, root_pid)]


def _interpreter_helper(left: Leftover, live: dict[int, _Stat], root_pid: int | None) -> bool:
    return live[left.pid].ppid == root_pid and any(h in left.cmdline for h in _INTERPRETER_HELPERS)


def check(run_id: str, grace: float = GRACE_S) -> list[Leftover]:
    """The leftovers of ``run_id`` once ``grace`` seconds have not made them exit."""
    deadline = time.monotonic() + grace
    while True:
        found = find_leftovers(
            run_id, root_pid=os.getpid(), ignore_pids={os.getpid()}, ignore_groups=_kept_groups
        )
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def kill(leftovers: Iterable[Leftover]) -> None:
    for leftover in leftovers:
        with contextlib.suppress(OSError):
            os.kill(leftover.pid, signal.SIGKILL)


def _podman(*args: str) -> subprocess.CompletedProcess[str] | None:
    """``podman args`` (None where podman is not installed, or does not answer)."""
    if shutil.which("podman") is None:
        return None
    try:
        return subprocess.run(
            ["podman", *args], capture_output=True, text=True, timeout=PODMAN_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return None


def find_containers(run_id: str) -> list[Container]:
    """The containers (running or not) annotated ``mailtap.test-run=<run_id>``."""
    listed = _podman("ps", "--all", "--quiet", "--no-trunc")
    ids = listed.stdout.split() if listed is not None and listed.returncode == 0 else []
    if not ids:
        return []
    # One may be removed between the two calls: inspect prints the others and exits 125.
    template = f'{{{{.Id}}}}\t{{{{.Name}}}}\t{{{{.Pod}}}}\t{{{{index .Config.Annotations "{CONTAINER_ANNOTATION}"}}}}'
    inspected = _podman("container", "inspect", "--format", template, *ids)
    found = []
    for line in inspected.stdout.splitlines() if inspected is not None else []:
        fields = line.split("\t")
        if len(fields) == 4 and fields[3] == run_id:
            found.append(Container(fields[0], fields[1], fields[2]))
    return found


def remove_containers(containers: Iterable[Container]) -> None:
    """Remove them at once, each pod with every container in it (a kube pod's own containers
    carry only what its manifest gives them; its infra container carries the annotation)."""
    containers = list(containers)
    pods = sorted({container.pod for container in containers if container.pod})
    if pods:
        _podman("pod", "rm", "--force", "--time", "0", *pods)
    alone = [container.id for container in containers if not container.pod]
    if alone:
        _podman("rm", "--force", "--time", "0", *alone)


def reap_when_orphaned(run_id: str, kept_file: str) -> None:
    """The reaper: block until pytest ends; unless it said the session ended normally, remove
    the containers of ``run_id`` and kill every process of it but the kept groups' (again,
    while any is left: a process being killed may have just forked)."""
    if sys.stdin.buffer.read() == _DONE:
        return
    remove_containers(find_containers(run_id))
    for _ in range(20):
        kept = {int(pgid) for pgid in Path(kept_file).read_text().split()}
        found = find_leftovers(run_id, ignore_pids={os.getpid()}, ignore_groups=kept)
        if not found:
            break
        kill(found)
        time.sleep(0.1)
    # Once more: a podman client of the run killed just now may have created one meanwhile.
    remove_containers(find_containers(run_id))
    with contextlib.suppress(OSError):
        os.unlink(kept_file)


def _start_reaper(run_id: str) -> None:
    global _reaper, _kept_file
    handle, name = tempfile.mkstemp(prefix="mailtap-test-kept-")
    os.close(handle)
    _kept_file = Path(name)
    _write_kept()
    env = {k: v for k, v in os.environ.items() if k != RUN_ENV}  # not one of the run's own
    _reaper = subprocess.Popen(
        [sys.executable, "-c", _REAPER, run_id, name, str(Path(__file__).resolve().parents[2])],
        stdin=subprocess.PIPE,
        env=env,
        start_new_session=True,  # out of reach of a signal to pytest's process group
    )


def _stop_reaper() -> None:
    global _reaper, _kept_file
    if _reaper is None:
        return
    assert _reaper.stdin is not None
    with contextlib.suppress(OSError):
        _reaper.stdin.write(_DONE)
        _reaper.stdin.close()
    _reaper.wait(30)
    _reaper = None
    if _kept_file is not None:
        _kept_file.unlink(missing_ok=True)
        _kept_file = None


# --- the plugin ---------------------------------------------------------------------------------


def pytest_sessionstart(session: pytest.Session) -> None:
    # A new id even when one is inherited: a pytest run inside a test checks its own processes.
    os.environ[RUN_ENV] = uuid.uuid4().hex
    _start_reaper(os.environ[RUN_ENV])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _stop_reaper()
    run_id = os.environ.get(RUN_ENV)
    if not run_id:
        return
    containers = find_containers(run_id)
    remove_containers(containers)
    found = check(run_id, float(os.environ.get(GRACE_ENV) or GRACE_S))
    if not found and not containers:
        return
    kill(found)
    lines = []
    if containers:
        lines.append(
            f"{len(containers)} container(s) the test session started outlived it (now removed):"
        )
        lines += [f"  {container}" for container in containers]
    if found:
        lines.append(
            f"{len(found)} process(es) started by the test session outlived it (now killed):"
        )
        lines += [f"  {leftover}" for leftover in found]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", "processes left behind", red=True)
        for line in lines:
            reporter.write_line(line, red=True)
    else:
        print("\n".join(lines))
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
