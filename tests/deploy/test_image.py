"""The image deploy/Dockerfile builds: labelled with the version of pyproject.toml, non-root,
its state paths writable by that user on a read-only root file system, no build tools, a
HEALTHCHECK, and its size (printed; deploy/README.md records it)."""

from __future__ import annotations

import json

from tests.support import deploy

SIZE_TARGET_MB = 250


def test_labels_user_healthcheck(podman, image) -> None:
    inspect = json.loads(podman.run("image", "inspect", image).stdout)[0]
    config = inspect["Config"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == deploy.project_version()
    assert image.endswith(f":{deploy.project_version()}")
    assert labels["org.opencontainers.image.title"] == "mailtap"
    assert config["User"] == "10001:10001"
    assert "/healthz" in " ".join(inspect["Healthcheck"]["Test"])  # podman: top level
    size_mb = inspect["Size"] / 1e6
    print(f"image {image}: {size_mb:.0f} MB (target <= {SIZE_TARGET_MB} MB)")


def test_state_paths_writable_on_a_read_only_root(podman, image, volume) -> None:
    # The named volume takes the image's ownership of /var/lib/mailtap (10001) on first mount:
    # the claim store and streams' data dir are writable, the rest is not.
    script = (
        "touch /var/lib/mailtap/claims/x /var/lib/mailtap/streams/x /tmp/x && "
        "! touch /opt/mailtap/x 2>/dev/null && ! touch /etc/mailtap/x 2>/dev/null && id -u"
    )
    result = podman.run(
        "run",
        "--rm",
        "--read-only",
        "--tmpfs",
        "/tmp",
        "--cap-drop",
        "ALL",
        "-v",
        f"{volume}:/var/lib/mailtap",
        "--entrypoint",
        "sh",
        image,
        "-c",
        script,
    )
    assert result.stdout.strip() == "10001"


def test_no_build_tools_in_the_final_image(podman, image) -> None:
    script = "for t in pip pip3 gcc cc make apt-get; do command -v $t; done; true"
    result = podman.run("run", "--rm", "--entrypoint", "sh", image, "-c", script)
    found = result.stdout.split()
    # apt-get comes with the Debian base (python:3.11-slim has it too); no compiler, no pip.
    assert [t for t in found if not t.endswith("apt-get")] == []
    check = podman.run(
        "run", "--rm", "--entrypoint", "python3", image, "-c", "import pip", check=False
    )
    assert check.returncode != 0
