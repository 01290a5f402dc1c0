"""Fixtures of the deploy tests: podman set up (deploy/podman/setup.sh), the image built
(deploy/podman/build-image.sh, cached), podman's Docker-compatible API for testcontainers.

Where podman cannot run (no podman and no root to install it, no user namespaces, ...), every
test here is skipped with the reason; nothing passes silently. ``MAILTAP_DEPLOY_TEST=require``
turns such a skip into a failure (for CI machines that must run them).

testcontainers talks to ``podman system service`` on a private socket; Ryuk (its reaper) cannot
be pulled here, so it is disabled and each fixture removes its own containers. For a session
killed before its fixtures end, the session's containers.conf marks every container it starts
(``mailtap.test-run=<the run's id>``, annotation and environment), and the leftovers plugin
(``tests/support/leftovers.py``) removes them.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mailtap.dev.process import die_with_parent
from tests.support import deploy, leftovers

SETUP = deploy.ROOT / "deploy" / "podman" / "setup.sh"
BUILD = deploy.ROOT / "deploy" / "podman" / "build-image.sh"


#: podman's default environment of a container (containers.conf(5)), which ``env`` replaces.
DEFAULT_CONTAINER_ENV = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "TERM=xterm",
)


@dataclass(frozen=True)
class Podman:
    env: dict[str, str]  # CONTAINERS_CONF (the session's), MAILTAP_BASE_IMAGE
    build_env: dict[str, str]  # CONTAINERS_CONF as setup.sh wrote it: nothing of the run

    def run(
        self, *args: str, check: bool = True, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["podman", *args],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"podman {shlex.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}"
            )
        return result


def _unavailable(reason: str) -> None:
    if os.environ.get("MAILTAP_DEPLOY_TEST") == "require":
        pytest.fail(f"deploy tests cannot run: {reason}")
    pytest.skip(f"deploy tests skipped: {reason}")


def marked_conf(setup_conf: Path, run_id: str, into: Path) -> Path:
    """setup.sh's containers.conf with every container marked as one of run ``run_id``."""
    marks = [*DEFAULT_CONTAINER_ENV, f"{leftovers.RUN_ENV}={run_id}"]
    text = setup_conf.read_text()
    assert "\n[containers]\n" in text, f"{setup_conf} has no [containers] table"
    text = text.replace(
        "\n[containers]\n",
        "\n[containers]\n"
        f"env = {json.dumps(marks)}\n"
        f"annotations = {json.dumps([f'{leftovers.CONTAINER_ANNOTATION}={run_id}'])}\n",
    )
    into.write_text(text)
    return into


@pytest.fixture(scope="session")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    setup = subprocess.run([str(SETUP), "--base"], capture_output=True, text=True, timeout=900)
    if setup.returncode != 0:
        _unavailable(f"deploy/podman/setup.sh failed:\n{setup.stderr[-2000:]}")
    env = dict(
        line.removeprefix("export ").split("=", 1)
        for line in setup.stdout.splitlines()
        if line.startswith("export ")
    )
    run_id = os.environ[leftovers.RUN_ENV]
    conf = marked_conf(
        Path(env["CONTAINERS_CONF"]),
        run_id,
        tmp_path_factory.mktemp("podman") / "containers.conf",
    )
    tool = Podman({**env, "CONTAINERS_CONF": str(conf)}, env)
    probe = tool.run(
        "run",
        "--rm",
        "--network",
        "host",
        env["MAILTAP_BASE_IMAGE"],
        "true",
        check=False,
        timeout=120,
    )
    if probe.returncode != 0:
        _unavailable(f"podman cannot run a container here:\n{probe.stderr[-2000:]}")
    return tool


@pytest.fixture(scope="session")
def image(podman: Podman) -> str:
    started = time.monotonic()
    build = subprocess.run(
        [str(BUILD)],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, **podman.build_env},
    )
    assert build.returncode == 0, build.stderr[-4000:]
    tag = build.stdout.strip().splitlines()[-1]
    print(f"image {tag} ready in {time.monotonic() - started:.1f} s")
    return tag


@pytest.fixture(scope="session")
def docker_api(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``DOCKER_HOST`` of a podman API service for testcontainers, stopped at the end."""
    socket = tmp_path_factory.mktemp("podman-api") / "podman.sock"
    url = f"unix://{socket}"
    service = subprocess.Popen(
        ["podman", "system", "service", "--time=0", url],
        env={**os.environ, **podman.env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=die_with_parent(),  # ends with the test session, even after a kill -9
    )
    deadline = time.monotonic() + 30
    while not socket.exists():
        if service.poll() is not None or time.monotonic() > deadline:
            service.kill()
            _unavailable(f"podman system service did not start: {service.stderr.read()!r}")  # type: ignore[union-attr]
        time.sleep(0.1)
    saved = {k: os.environ.get(k) for k in ("DOCKER_HOST", "TESTCONTAINERS_RYUK_DISABLED")}
    os.environ["DOCKER_HOST"] = url
    os.environ["TESTCONTAINERS_RYUK_DISABLED"] = "true"
    try:
        yield url
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        service.terminate()
        try:
            service.wait(15)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait(5)


@pytest.fixture
def volume(podman: Podman, unique: str) -> Iterator[str]:
    """A fresh named volume (the claims/state volume of compose), removed afterwards."""
    name = f"mailtap-test-{unique}"
    podman.run("volume", "create", name)
    try:
        yield name
    finally:
        podman.run("volume", "rm", "--force", name, check=False)
