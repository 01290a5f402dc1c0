"""Start, watch and stop the local service processes.

Every service is started in its own session (``start_new_session=True``), so its process id is
also its process-group id: stopping the group reaches the children a service forks (Dovecot's
``imap-login``, ``auth``, ``imap`` …) without ever touching a process we did not start.
"""

from __future__ import annotations

import argparse
import contextlib
import grp
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

from mailtap.dev.errors import ServiceStartError
from mailtap.dev.layout import REPO_ROOT

#: How many log lines a start-up failure quotes.
LOG_TAIL_LINES = 20

#: SIGTERM grace period before SIGKILL. Dovecot needs ~1 s to stop, the Kafka broker a few
#: seconds (controlled shutdown of the log manager); on a loaded 2-core machine, more.
STOP_TIMEOUT_S = 20.0


def java(service: str) -> str:
    """The ``java`` of ``$JAVA_HOME``, else the one on PATH, for a JVM service."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise ServiceStartError(f"{service}: no `java` on PATH (install a JRE >= 17)")
    return found


def maven(
    service: str, args: Sequence[str], log: Path, timeout: float, cwd: Path | None = None
) -> None:
    """Run ``mvn -B <args>`` with its output in ``log``; a failure raises with the log's tail."""
    mvn = shutil.which("mvn")
    if not mvn:
        raise RuntimeError(f"{service}: no `mvn` on PATH (deploy/bootstrap.sh installs Maven)")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        result = subprocess.run(
            [mvn, "-B", *args],
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    if result.returncode != 0:
        raise RuntimeError(
            f"{service}: Maven failed (exit {result.returncode}); see {log}:\n{log_tail(log)}"
        )


#: The lowest port handed out for servers started later: below it are the well-known ports.
LOWEST_SERVER_PORT = 10000


def _ephemeral_start() -> int:
    """The first port of the kernel's range for outgoing connections (Linux: 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bind_server_port(sock: socket.socket, host: str) -> int:
    """Bind ``sock`` to a free port below the ephemeral range (any port if that range leaves
    too little room below it) and return the port. A port another held socket is bound to
    refuses the bind like any taken one."""
    top = _ephemeral_start()
    if top - LOWEST_SERVER_PORT >= 1000:
        for _ in range(200):
            port = random.randrange(LOWEST_SERVER_PORT, top)
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    sock.bind((host, 0))
    return int(sock.getsockname()[1])


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now, for a server that binds it later.

    Not one the kernel would pick for ``bind(0)`` or an outgoing connection: between the pick
    and the server's bind (seconds for a JVM or a container's imports) a client's connection
    could take such a port, and the server would fail to start (EADDRINUSE).
    """
    return free_ports(1, host)[0]


@contextlib.contextmanager
def reserved_ports(count: int, host: str = "127.0.0.1") -> Iterator[list[int]]:
    """``count`` distinct free TCP ports (as `free_port` picks them), each held bound until
    the block ends.

    Calls to `free_port` one after another could return one port twice (each is released
    before the next pick): within the block they cannot. Bind what must not take them (proxies
    on port 0) inside the block; start the servers after it.
    """
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        yield [_bind_server_port(sock, host) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports free on ``host`` right now (see `free_port`)."""
    with reserved_ports(count, host) as ports:
        return ports


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a server could listen on ``port`` now.

    SO_REUSEADDR as the servers set it: connections of an earlier run that linger in TIME_WAIT
    do not stop a server from binding, so they must not make the port look taken either.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


#: prctl(2) option: the signal a process gets when its parent ends.
PR_SET_PDEATHSIG = 1

_tied = False


def tie_services_to_this_process() -> None:
    """From now on, services this process spawns get SIGKILL when it ends, however it ends.

    For a test session that starts its own services: a kill -9 of pytest must not leave a
    broker and a Dovecot behind. ``mailtap dev up`` does not call it (its services are meant to
    outlive the command), nor does a test session that keeps its services on purpose.
    """
    global _tied
    _tied = True


#: What a tied service runs under (``sh -c GROUP_GUARD sh ARGV...``): the service as its child,
#: in its process group, and at PR_SET_PDEATHSIG's SIGUSR1 (the session ended) a SIGKILL to the
#: whole group. PR_SET_PDEATHSIG alone reaches only the process we started: the servers a
#: service forks stay behind (Cyrus's imapd and idled outlived a killed test session). Other
#: signals are trapped to nothing, not ignored (an ignored one would be ignored by the service
#: too): a SIGTERM to the group stops the service as before, and the guard ends with it,
#: with its status. The service's own pid (a pid file's) is then not its group's id: stop a
#: group found that way by ``os.getpgid(pid)``.
GROUP_GUARD = """
trap 'kill -KILL 0' USR1
trap ':' TERM INT HUP
"$@" &
service=$!
while :; do
    wait "$service"
    status=$?
    kill -0 "$service" 2>/dev/null || exit "$status"
done
"""


def die_with_parent(signal_number: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn`` that makes the child get ``signal_number`` (SIGKILL) when the *thread*
    that forked it ends
    (``PR_SET_PDEATHSIG``, Linux): call it from the thread that lives as long as the child
    should — the main thread of a test session or of a command.

    The parent may die between the fork and the prctl; the child checks it is still the parent's
    and exits otherwise.
    """
    import ctypes

    parent = os.getpid()
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal_number, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def spawn(
    argv: Sequence[str],
    log_path: Path,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    user: str | None = None,
) -> int:
    """Start ``argv`` detached in a new session, stdout and stderr appended to ``log_path``.

    Returns the process id, which is also the process-group id. The process outlives the caller
    (``mailtap dev up`` returns while the services keep running) unless
    :func:`tie_services_to_this_process` was called: then the process is a shell
    (:data:`GROUP_GUARD`) that runs ``argv`` and takes its whole group down when the caller
    ends. ``user``: run as that user (and its group) from the start; needs root.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = list(argv)
    if _tied:
        command = ["/bin/sh", "-c", GROUP_GUARD, "sh", *command]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
            # Switched before preexec_fn runs: a credential change clears PR_SET_PDEATHSIG, so
            # a server that drops root itself (Cyrus's master) would outlive a killed session.
            user=user,
            group=grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name if user else None,
            extra_groups=[] if user else None,
            preexec_fn=die_with_parent(signal.SIGUSR1) if _tied else None,
        )
    return proc.pid


def _reap(pid: int) -> None:
    """Collect ``pid`` if it is our own exited child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def is_alive(pid: int) -> bool:
    """True when ``pid`` runs and is not a zombie."""
    _reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: trust kill(0)
    # The state letter follows the parenthesised command name, which may itself contain spaces.
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (proc(5) field 22); None if gone.

    Recorded with each pid so that a pid the kernel reused after a reboot is never mistaken for
    (and never signalled as) a service we started.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name start at field 3 (state); field 22 is at index 19.
    return int(stat.rsplit(")", 1)[1].split()[19])


def group_members(pgid: int) -> list[int]:
    """Process ids of every live (non-zombie) process in process group ``pgid`` (from /proc)."""
    members: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        # fields[0] = state, fields[1] = ppid, fields[2] = pgrp (proc(5))
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def _stat_fields(pid: int) -> list[str] | None:
    """proc(5) ``stat`` fields from field 3 (state) on; None when ``pid`` is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def cpu_seconds(pid: int, *, reaped_children: bool = False) -> float:
    """CPU seconds (user + system) ``pid`` has used, 0.0 once it is gone; with
    ``reaped_children``, plus those of the children it has waited for (proc(5) fields 14-17)."""
    fields = _stat_fields(pid)
    return 0.0 if fields is None else _cpu(fields, reaped_children)


def _cpu(fields: list[str], reaped_children: bool) -> float:
    # utime, stime, cutime, cstime are fields 14-17 (indexes 11-14 from the state field).
    ticks = int(fields[11]) + int(fields[12])
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(pgid: int) -> float:
    """CPU seconds process group ``pgid`` has used: every member (zombies too), plus the
    children they have reaped — so the figure never drops when a forked process exits.

    A service started by `spawn` is its own group: this counts that service and what it forks,
    never another run's processes that merely share its command name.
    """
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None and int(fields[2]) == pgid:
            total += _cpu(fields, reaped_children=True)
    return total


def stop_group(
    pgid: int, timeout: float = STOP_TIMEOUT_S, expected_start: int | None = None
) -> bool:
    """SIGTERM the process group ``pgid``; SIGKILL what is left after ``timeout`` seconds.

    Returns True when the group was running. With ``expected_start`` (see `start_time`), a live
    group leader that started at another time is a stranger that reuses the pid: left alone.
    """
    if not group_members(pgid) and not is_alive(pgid):
        return False
    leader_start = start_time(pgid)
    if expected_start is not None and leader_start is not None and leader_start != expected_start:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pgid)
        if not group_members(pgid):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while group_members(pgid) and time.monotonic() < deadline:
        _reap(pgid)
        time.sleep(0.05)
    return True


def terminate(proc: subprocess.Popen[str] | subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """SIGTERM ``proc`` and wait up to ``grace`` seconds for it; then SIGKILL it (a component
    ends within about 2 s of SIGTERM in any state; the grace is a hang guard)."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file, or a note that there is none yet."""
    try:
        data = path.read_bytes()
    except OSError:
        return f"(no log at {path})"
    text = data.decode("utf-8", errors="replace").splitlines()
    return "\n".join(text[-lines:]) if text else f"(log {path} is empty)"


def wait_until_ready(
    name: str,
    pid: int | None,
    probe: Callable[[], None],
    logs: Sequence[Path],
    timeout: float,
    interval: float = 0.1,
) -> None:
    """Call ``probe`` until it returns without raising, while ``pid`` stays alive.

    ``pid`` None means there is no process of ours to watch (a service someone else runs).

    The process must still be alive *after* a successful probe: another instance left over on
    the same port or base directory may answer while ours has already died.
    Raises `ServiceStartError` with the last lines of ``logs`` on death or timeout.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        if pid is not None and not is_alive(pid):
            raise ServiceStartError(_failure(name, f"process {pid} exited during start-up", logs))
        try:
            probe()
        except Exception as exc:  # any failure to answer means "not ready yet"
            last_error = exc
        else:
            if pid is None or is_alive(pid):
                return
            raise ServiceStartError(_failure(name, f"process {pid} exited during start-up", logs))
        if time.monotonic() > deadline:
            reason = f"no answer within {timeout:.0f} s (last error: {last_error!r})"
            raise ServiceStartError(_failure(name, reason, logs))
        time.sleep(interval)


def _failure(name: str, reason: str, logs: Sequence[Path]) -> str:
    parts = [f"{name} did not start: {reason}"]
    for log in logs:
        parts.append(f"--- last {LOG_TAIL_LINES} lines of {log} ---\n{log_tail(log)}")
    return "\n".join(parts)


def stop_recorded(pid_file: Path, *also_remove: Path) -> bool:
    """Stop the process group whose id ``pid_file`` holds and remove the files; True when one
    was running."""
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return False
    was_running = stop_group(pid)
    for file in (pid_file, *also_remove):
        file.unlink(missing_ok=True)
    return was_running


def service_main(service: ModuleType, argv: list[str] | None = None) -> int:
    """``python -m mailtap.dev.<name> build|start|stop`` of an optional JVM service module: it
    has ``build(force=)``, ``start(state_dir, port=)`` (a result with ``.address``, printed) and
    ``stop(state_dir)``."""
    module = service.__spec__.name if service.__spec__ else service.__name__  # not "__main__"
    name = module.rpartition(".")[2]
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=service.__doc__)
    parser.add_argument("action", choices=["build", "start", "stop"])
    parser.add_argument("--state-dir", type=Path, default=REPO_ROOT / ".state" / name)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--force", action="store_true", help="build even if up to date")
    args = parser.parse_args(argv)
    if args.action == "build":
        print(service.build(force=args.force))
    elif args.action == "start":
        print(service.start(args.state_dir, port=args.port).address)
    else:
        print("stopped" if service.stop(args.state_dir) else "not running")
    return 0
