"""The local Confluent-compatible schema registry: Apicurio Registry 2.4.2, stored on disk.

``mailtap dev up`` starts it next to Kafka and writes its URL into the ready config
(``kafka.schema_registry_url``), so the local services use the Confluent wire format like a
production deployment; tests start their own. Maven Central serves only Apicurio's plain application jar, so ``build()`` runs the
Quarkus build on it from ``deploy/local/registry`` (see the pom for why this version) into
``.cache/registry/app``. Not part of ``deploy/bootstrap.sh``: a cold build fetches ~300 jars.

    python -m mailtap.dev.registry build                 # once; `make registry` does this
    python -m mailtap.dev.registry start --state-dir D   # prints the URL
    python -m mailtap.dev.registry stop --state-dir D

The Confluent-compatible API is at ``<base>/apis/ccompat/v7``; that is the URL ``start`` returns.

Storage is an H2 database *file* in the state directory (Apicurio's SQL storage; the build has no
KafkaSQL storage): the schema ids written into records on Kafka must mean the same schemas after
a restart, and Kafka's data outlives the registry process. ``WRITE_DELAY=0`` makes H2 write each
commit through before the registry answers: with H2's default (500 ms) a schema registered just
before a kill -9 was gone after the restart, while its id could already be on a topic.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from mailtap.dev import process
from mailtap.dev.errors import ServiceStartError
from mailtap.dev.layout import REPO_ROOT, TEMPLATES

#: Overrides the folder holding the built registry (default: ``.cache/registry`` in the checkout).
ENV_REGISTRY_HOME = "MAILTAP_REGISTRY_HOME"
SOURCES = TEMPLATES / "registry"
CCOMPAT_PATH = "/apis/ccompat/v7"

#: Quarkus starts the registry in ~7 s here (cold JVM, H2 schema creation); a loaded 2-core CI
#: box can take several times that.
START_TIMEOUT_S = 120.0
#: A cold build resolves ~300 jars plus the Quarkus build-time ones; a warm one takes ~30-90 s.
BUILD_TIMEOUT_S = 1800.0
#: Resident memory is ~190 MB with this heap cap.
JVM_OPTS = ("-Xmx256m", "-Xms64m", "-XX:+UseSerialGC", "-Djava.awt.headless=true")


def registry_home() -> Path:
    return Path(os.environ.get(ENV_REGISTRY_HOME, REPO_ROOT / ".cache" / "registry"))


def run_jar() -> Path:
    return registry_home() / "app" / "quarkus-run.jar"


def is_installed() -> bool:
    """True when ``build()`` has produced a runnable registry."""
    return run_jar().is_file()


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in SOURCES.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(SOURCES)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def build(force: bool = False) -> Path:
    """Build the registry into ``.cache/registry/app`` unless the sources are unchanged.

    Builds in a copy of ``deploy/local/registry`` (Maven writes ``target/`` next to the pom) and
    swaps the result in only when the build succeeded. Returns the run jar.
    """
    home = registry_home()
    stamp = home / ".sources-sha256"
    want = _sources_digest()
    if not force and is_installed() and stamp.is_file() and stamp.read_text() == want:
        return run_jar()
    work = home / "build"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(SOURCES, work)
    process.maven(
        "registry", ["package", "-DskipTests"], home / "build.log", BUILD_TIMEOUT_S, cwd=work
    )
    app = home / "app"
    shutil.rmtree(app, ignore_errors=True)
    (work / "target" / "quarkus-app").rename(app)
    shutil.rmtree(work, ignore_errors=True)
    stamp.write_text(want)
    return run_jar()


@dataclass(frozen=True)
class RegistryLayout:
    """Files of one registry process inside a state directory."""

    root: Path

    @property
    def stdout_log(self) -> Path:
        return self.root / "registry.log"

    @property
    def pid_file(self) -> Path:
        return self.root / "registry.pid"

    @property
    def url_file(self) -> Path:
        return self.root / "registry.url"

    @property
    def database(self) -> Path:
        """H2's file name prefix (H2 adds ``.mv.db``)."""
        return self.root / "db" / "registry"

    @property
    def jdbc_url(self) -> str:
        return f"jdbc:h2:file:{self.database};WRITE_DELAY=0;LOCK_TIMEOUT=30000"


@dataclass(frozen=True)
class RunningRegistry:
    url: str  # the Confluent-compatible base URL, for kafka.schema_registry_url
    pid: int  # also the process-group id
    port: int

    @property
    def address(self) -> str:
        return self.url


def probe(url: str, timeout: float = 2.0) -> None:
    """Raise unless ``GET <url>/subjects`` answers 200 with a JSON list."""
    with urllib.request.urlopen(f"{url}/subjects", timeout=timeout) as response:
        if not isinstance(json.load(response), list):
            raise RuntimeError(f"{url}/subjects did not answer a JSON list")


def start(state_dir: Path, host: str = "127.0.0.1", port: int | None = None) -> RunningRegistry:
    """Start the registry on ``host:port`` (a free port by default) and wait until it answers."""
    running = launch(state_dir, host, port)
    wait_ready(state_dir, running)
    return running


def launch(state_dir: Path, host: str = "127.0.0.1", port: int | None = None) -> RunningRegistry:
    """Start the registry process without waiting for it (``mailtap dev up`` starts it next to
    Kafka and waits for both); `wait_ready` waits."""
    if not is_installed():
        raise ServiceStartError(
            f"registry: not built ({run_jar()} is missing); run `make registry`"
        )
    layout = RegistryLayout(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    port = port or process.free_port(host)
    layout.database.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        process.java("registry"),
        *JVM_OPTS,
        f"-Djava.io.tmpdir={state_dir}",
        # Apicurio's application.properties reads the prod datasource URL from this property.
        f"-DREGISTRY_DATASOURCE_URL={layout.jdbc_url}",
        f"-Dquarkus.http.host={host}",
        f"-Dquarkus.http.port={port}",
        "-jar",
        str(run_jar()),
    ]
    pid = process.spawn(argv, layout.stdout_log, cwd=state_dir)
    layout.pid_file.write_text(str(pid))
    return RunningRegistry(f"http://{host}:{port}{CCOMPAT_PATH}", pid, port)


def wait_ready(state_dir: Path, running: RunningRegistry) -> None:
    """Wait until the registry `launch` started answers; stop it and raise if it does not."""
    layout = RegistryLayout(state_dir)
    try:
        process.wait_until_ready(
            "registry",
            running.pid,
            lambda: probe(running.url),
            [layout.stdout_log],
            START_TIMEOUT_S,
            interval=0.2,
        )
    except BaseException:
        stop(state_dir)
        raise
    layout.url_file.write_text(running.url)


def stop(state_dir: Path) -> bool:
    """Stop the registry started in ``state_dir``; True when one was running."""
    layout = RegistryLayout(state_dir)
    return process.stop_recorded(layout.pid_file, layout.url_file)


def main(argv: list[str] | None = None) -> int:
    return process.service_main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
