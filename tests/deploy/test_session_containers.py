"""No container a test session starts outlives it (``tests/support/leftovers.py``).

podman's ``conmon`` keeps a container running outside the session's processes, so these run an
inner pytest session that starts a container the way the deploy tests do (podman with the
session's marked containers.conf) and check, with podman itself, that it is gone: after the
session ended normally without removing it (the session fails, naming it), and after a kill -9
of the session (its reaper removes it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from mailtap.dev import process
from tests.deploy.conftest import Podman
from tests.support import deploy

WAIT_S = 120.0

STARTS_A_CONTAINER = """
import os
import subprocess
import time
from pathlib import Path

from tests.deploy.conftest import marked_conf
from tests.support import leftovers


def test_starts_a_container(tmp_path: Path) -> None:
    conf = marked_conf(
        Path(os.environ["CONTAINERS_CONF"]), os.environ[leftovers.RUN_ENV], tmp_path / "c.conf"
    )
    subprocess.run(
        ["podman", "run", "--detach", "--name", "{name}", "--network", "none", "{image}",
         "sleep", "3600"],
        env={{**os.environ, "CONTAINERS_CONF": str(conf)}},
        check=True,
        capture_output=True,
    )
    Path("{started}").write_text("started")
    time.sleep({sleep})
"""


def _inner(podman: Podman, tmp_path: Path, name: str, sleep: int) -> tuple[Path, list[str]]:
    started = tmp_path / "started"
    test_file = tmp_path / "test_inner_containers.py"
    test_file.write_text(
        STARTS_A_CONTAINER.format(
            name=name,
            image=podman.env["MAILTAP_BASE_IMAGE"],
            started=started,
            sleep=sleep,
        )
    )
    command = [sys.executable, "-m", "pytest", "-p", "tests.support.leftovers", "-q"]
    return started, [*command, "-p", "no:cacheprovider", str(test_file)]


def _env(podman: Podman) -> dict[str, str]:
    return {**os.environ, **podman.build_env, "PYTHONPATH": str(deploy.ROOT)}


def _exists(podman: Podman, name: str) -> bool:
    return podman.run("container", "exists", name, check=False).returncode == 0


def test_a_session_that_leaves_a_container_fails_naming_it_and_removes_it(
    podman: Podman, tmp_path: Path, unique: str
) -> None:
    name = f"mailtap-test-left-{unique}"
    _, command = _inner(podman, tmp_path, name, sleep=0)
    try:
        run = subprocess.run(
            command,
            cwd=tmp_path,
            env=_env(podman),
            capture_output=True,
            text=True,
            timeout=WAIT_S,
        )
        assert run.returncode == 1, run.stdout + run.stderr
        assert "1 passed" in run.stdout  # the test passed: the session's check failed the run
        assert "1 container(s) the test session started outlived it" in run.stdout
        assert f"container {name} (" in run.stdout
        assert not _exists(podman, name)
    finally:
        podman.run("rm", "--force", "--time", "0", name, check=False)


def test_a_kill_9_of_the_session_removes_its_containers(
    podman: Podman, tmp_path: Path, unique: str
) -> None:
    name = f"mailtap-test-killed-{unique}"
    started, command = _inner(podman, tmp_path, name, sleep=600)
    inner = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=_env(podman),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while not started.exists():
            assert inner.poll() is None, f"the inner session exited {inner.returncode}"
            assert time.monotonic() < deadline, "the inner session did not start its container"
            time.sleep(0.1)
        assert podman.run("inspect", "--format", "{{.State.Running}}", name).stdout.strip() == (
            "true"
        )
        inner.kill()
        inner.wait(WAIT_S)
        deadline = time.monotonic() + WAIT_S
        while _exists(podman, name) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _exists(podman, name)
    finally:
        if inner.poll() is None:
            inner.kill()
        if process.is_alive(inner.pid):
            inner.wait(10)
        podman.run("rm", "--force", "--time", "0", name, check=False)
