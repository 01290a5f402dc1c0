"""Run mailtap components as child processes (the demo, the e2e benchmark, pipeline tests).

Each component runs exactly as in production — ``mailtap run <component> -c CONFIG`` — in its own
process group, with its log in a file, so a test can ``kill -9`` one and start it again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mailtap.dev.process import die_with_parent

#: SIGTERM first: sources finish the open transaction and the sink records outcomes. A component
#: still there after this long is killed; the exactly-once design makes that safe, only slower.
STOP_GRACE_S = 15.0


@dataclass
class Component:
    name: str
    config_path: Path
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Component:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mailtap.cli",
                "-v",
                "run",
                self.name,
                "-c",
                str(self.config_path),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env},
            start_new_session=True,
            # A kill -9 of whoever started the component (a test, the demo) ends it too.
            preexec_fn=die_with_parent(),
        )
        log.close()
        return self

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group: a crash, no clean-up at all."""
        if self.process is not None and self.alive:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self, grace: float = STOP_GRACE_S) -> int | None:
        if self.process is None:
            return None
        if self.alive:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        return self.process.returncode

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


@dataclass
class Pipeline:
    """The IMAP source, the streams worker and the SMTP sink on one config."""

    config_path: Path
    log_dir: Path
    names: tuple[str, ...] = ("imap-source", "streams", "smtp-sink")
    env: dict[str, str] = field(default_factory=dict)
    components: dict[str, Component] = field(default_factory=dict)

    def start(self) -> Pipeline:
        for name in self.names:
            self.components[name] = Component(
                name, self.config_path, self.log_dir / f"{name}.log", dict(self.env)
            ).start()
        return self

    def check_alive(self) -> None:
        for comp in self.components.values():
            if not comp.alive:
                code = comp.process.returncode if comp.process else None
                raise RuntimeError(
                    f"component {comp.name} exited with {code}; last log lines:\n{comp.log_tail()}"
                )

    def stop(self) -> None:
        for comp in reversed(list(self.components.values())):
            comp.stop()

    def __enter__(self) -> Pipeline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.2) -> bool:
    """Poll ``predicate()`` until it is truthy or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
