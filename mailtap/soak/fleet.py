"""The soak's component instances: 3 imap-source, 2 streams, 2 smtp-sink, each ``mailtap run``
in its own process group with its own config (its own Kafka, IMAP and SMTP proxies) and health
port, restarted by the harness after a kill as an orchestrator would.

A sample of an instance is what /proc says of its process group: RSS (the sum over the group's
processes) and open file descriptors.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mailtap.dev.process import die_with_parent, free_port, group_members, port_is_free
from mailtap.dev.tcp_proxy import TcpProxy

SOURCES = ("imap-source-1", "imap-source-2", "imap-source-3")
STREAMS = ("streams-1", "streams-2")
SINKS = ("smtp-sink-1", "smtp-sink-2")
INSTANCES = (*SOURCES, *STREAMS, *SINKS)


def component_of(instance: str) -> str:
    return instance.rsplit("-", 1)[0]


@dataclass
class Instance:
    name: str
    config: dict[str, Any]
    run_dir: Path
    health_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    lives: int = 0
    #: the instance's proxy toward the SMTP relay (sinks only)
    smtp_proxy: TcpProxy | None = None
    #: killed by a fault and waiting for its restart: not a crash
    killed_on_purpose: bool = False
    #: the fault thread (restart after a kill) and the supervisor (restart after an exit) both
    #: start instances: without it both saw the same dead process and started two, one of them
    #: untracked (a third streams worker, an orphan at the end)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    @property
    def component(self) -> str:
        return component_of(self.name)

    @property
    def config_path(self) -> Path:
        return self.run_dir / f"{self.name}.yaml"

    @property
    def log_path(self) -> Path:
        return self.run_dir / "logs" / f"{self.name}.log"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "mailtap.cli", "-v", "run", self.component]

    def start(self) -> None:
        """Start the instance unless it runs: a second start of one identity is a no-op."""
        with self._lock:
            if self.alive:
                return
            if not port_is_free(self.health_port):
                # Picked free a while ago; another process on this shared machine took it since.
                self.health_port = free_port()
            doc = {**self.config, "health": {"host": "127.0.0.1", "port": self.health_port}}
            self.config_path.write_text(yaml.safe_dump(doc, sort_keys=False))
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "ab") as log:
                log.write(f"\n=== soak: start #{self.lives + 1} at {time.ctime()} ===\n".encode())
                log.flush()
                self.proc = subprocess.Popen(
                    [*self.command(), "-c", str(self.config_path)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                    start_new_session=True,
                    preexec_fn=die_with_parent(),
                )
            self.lives += 1
            self.killed_on_purpose = False

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9 of the whole group: a crash, nothing cleaned up."""
        with self._lock:
            if self.proc is None:
                return
            self.killed_on_purpose = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, grace: float = 15.0) -> None:
        if self.proc is None or not self.alive:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.kill()

    def exited_by_itself(self) -> int | None:
        """The exit status when the instance ended without a fault or a stop asking it to."""
        with self._lock:
            if self.proc is None or self.killed_on_purpose:
                return None
            return self.proc.poll()

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(line for line in text[-lines:] if "librdkafka" not in line)

    def health(self) -> tuple[bool, dict[str, Any] | None]:
        url = f"http://127.0.0.1:{self.health_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=3) as answer:
                return True, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            try:
                return False, json.loads(exc.read())
            except ValueError:
                return False, None
        except (OSError, ValueError):
            return False, None

    def sample(self) -> tuple[int, int] | None:
        """(RSS bytes, open fds) of the instance's process group; None when it is down."""
        if self.proc is None or not self.alive:
            return None
        rss = fds = 0
        for pid in group_members(self.proc.pid):
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1]) * 1024
                fds += len(os.listdir(f"/proc/{pid}/fd"))
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
        return rss, fds
