"""A mailtap component in a container, as the shipped files run it: the image's user, a read-only
root file system with a tmpfs /tmp, no capability, the host's network (the test services listen
on the loopback), a shipped config mounted read-only and only environment overrides."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from testcontainers.core.container import DockerContainer

CONFIG_PATH = "/etc/mailtap/mailtap.yaml"
STATE_PATH = "/var/lib/mailtap"


def mailtap_container(
    image: str, args: list[str], config: Path, env: Mapping[str, str], volume: str
) -> DockerContainer:
    container = DockerContainer(image).with_command(args)
    container.with_volume_mapping(str(config), CONFIG_PATH, "ro")
    container.with_volume_mapping(volume, STATE_PATH, "rw")
    container.with_envs(**dict(env))
    container.with_tmpfs_mount("/tmp", "rw,size=64m")  # podman: mount options
    container.with_kwargs(
        network_mode="host",
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
    )
    return container


def logs(container: DockerContainer, lines: int = 40) -> str:
    out, err = container.get_logs()
    text = (out + err).decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def status(container: DockerContainer) -> str:
    wrapped = container.get_wrapped_container()
    wrapped.reload()
    return str(wrapped.status)


def healthz(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=3) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except OSError:
        return 0, {}


def wait_healthy(container: DockerContainer, port: int, timeout: float = 180.0) -> dict[str, Any]:
    """Probe /healthz from the host, as a kubelet would (podman runs no HEALTHCHECK here)."""
    deadline = time.monotonic() + timeout
    code, detail = 0, {}
    while time.monotonic() < deadline:
        code, detail = healthz(port)
        if code == 200:
            return detail
        if status(container) not in ("running", "created"):
            break
        time.sleep(1)
    raise AssertionError(
        f"not healthy (last /healthz {code} {detail}, status {status(container)}):\n"
        f"{logs(container)}"
    )


def run_once(container: DockerContainer, timeout: float = 180) -> tuple[int, str]:
    """Start a one-shot command (topics ensure), wait for its exit, remove it."""
    container.start()
    try:
        result = container.get_wrapped_container().wait(timeout=timeout)
        return int(result["StatusCode"]), logs(container, 200)
    finally:
        container.stop()
