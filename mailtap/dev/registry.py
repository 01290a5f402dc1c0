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

Apicurio 2.4's SQL storage is not safe under concurrent writes on H2, and the components that
start together register at the same moment: its id sequences are read, then inserted or updated
(``AbstractSqlRegistryStorage.nextSequenceValue``), and two registrations of the same content
(the key schema ``"string"`` of every ``T-key``) insert it twice. On a fresh database four
concurrent first registrations locked each other until H2's lock timeout (30 s here), then three
of them failed with HTTP 500 - the 29-60 s and the 500 of a first ``make demo``. The registry
therefore handles one request at a time (``quarkus.thread-pool.max-threads=1``): with no two
transactions at once nothing can collide, and a registration takes 10-40 ms warm, so a handful of
components queue for well under a second. `wait_ready` counts the registry as ready only once a
registration went through (see `probe_registration`), not when it first answers a GET.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
import time
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

#: Quarkus starts the registry in ~4-5 s here (cold JVM, H2 schema creation); a loaded 2-core
#: CI box can take several times that.
START_TIMEOUT_S = 120.0
#: A cold build resolves ~300 jars plus the Quarkus build-time ones; a warm one takes ~30-90 s.
BUILD_TIMEOUT_S = 1800.0
#: Resident memory is ~190 MB with this heap cap. ``TieredStopAtLevel=1`` compiles with C1 only:
#: a local registry serves a few dozen requests, never long enough for C2 to pay off, and on a
#: busy 2-core machine C2's compile threads made the start take 5-17 s instead of 4-5 s
#: (interleaved starts, HTTP answer then first registration).
JVM_OPTS = (
    "-Xmx256m",
    "-Xms64m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Djava.awt.headless=true",
)
#: Run-time Quarkus settings (see the module docstring): one request at a time, so Apicurio's
#: SQL storage never runs two transactions at once; its prod profile opens 20 JDBC connections
#: at start, which a serialised registry does not need.
QUARKUS_PROPERTIES = {
    "quarkus.thread-pool.core-threads": "1",
    "quarkus.thread-pool.max-threads": "1",
    "quarkus.datasource.jdbc.initial-size": "2",
    "quarkus.datasource.jdbc.min-size": "2",
}
#: The subject `probe_registration` registers and deletes. It ends neither in ``-key`` nor in
#: ``-value``, so it is no TopicNameStrategy subject and cannot be a component's.
PROBE_SUBJECT = "_mailtap-readiness-probe"
PROBE_SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "ReadinessProbe",
        "namespace": "io.mailtap.dev",
        "doc": "Registered and deleted by `mailtap dev up` to check the registry accepts writes.",
        "fields": [],
    }
)
#: One registration on a cold registry took up to ~2 s here on a loaded machine.
PROBE_TIMEOUT_S = 15.0


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


def _call(url: str, method: str, body: dict[str, str] | None, timeout: float) -> object:
    request = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def probe_registration(url: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Raise unless the registry registers a schema: register `PROBE_SCHEMA` under
    `PROBE_SUBJECT`, then delete the subject (soft, then permanently) so the registry holds only
    what the components register.

    A throwaway subject rather than mailtap's own schemas: the services do not know which topics
    a config names (tests use topic names of their own), and the components set the compatibility
    and register their schemas themselves (connectors.core.schemaregistry). The probe runs the
    same write path as theirs (id sequences, content, artifact, version), so the registry's
    first-write work (sequence rows, class loading, JIT) is done before ``dev up`` returns.

        POST   /subjects/_mailtap-readiness-probe/versions {"schema": "..."} -> {"id": 1}
        DELETE /subjects/_mailtap-readiness-probe                           -> [1]
        DELETE /subjects/_mailtap-readiness-probe?permanent=true            -> [1]
    """
    subject = f"{url}/subjects/{PROBE_SUBJECT}"
    answer = _call(f"{subject}/versions", "POST", {"schema": PROBE_SCHEMA}, timeout)
    if not isinstance(answer, dict) or not isinstance(answer.get("id"), int):
        raise RuntimeError(f"{url} answered a registration with {answer!r}, not a schema id")
    _call(subject, "DELETE", None, timeout)
    _call(f"{subject}?permanent=true", "DELETE", None, timeout)


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
        *(f"-D{name}={value}" for name, value in QUARKUS_PROPERTIES.items()),
        f"-Dquarkus.http.host={host}",
        f"-Dquarkus.http.port={port}",
        "-jar",
        str(run_jar()),
    ]
    pid = process.spawn(argv, layout.stdout_log, cwd=state_dir)
    layout.pid_file.write_text(str(pid))
    return RunningRegistry(f"http://{host}:{port}{CCOMPAT_PATH}", pid, port)


def wait_ready(state_dir: Path, running: RunningRegistry) -> None:
    """Wait until the registry `launch` started accepts a registration (`probe_registration`);
    stop it and raise if it does not."""
    layout = RegistryLayout(state_dir)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        # A GET while Quarkus starts (cheap to repeat every 0.2 s), then one registration.
        for check in (probe, probe_registration):
            process.wait_until_ready(
                "registry",
                running.pid,
                functools.partial(check, running.url),
                [layout.stdout_log],
                max(0.0, deadline - time.monotonic()),
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
