"""A local S3-compatible server for the S3 claim-check store's tests: S3Proxy over a folder.

S3Proxy (https://github.com/gaul/s3proxy) serves the S3 REST API, with AWS signature v2/v4
authentication, on top of Apache jclouds' filesystem provider: buckets are folders, objects are
files. ``build()`` resolves it from Maven Central (``deploy/local/s3proxy/pom.xml``) into
``.cache/s3proxy/libs``; not part of ``deploy/bootstrap.sh`` (``make s3proxy``, a prerequisite
of ``make test``, does it).

    python -m mailtap.dev.s3proxy build                 # once; `make s3proxy` does this
    python -m mailtap.dev.s3proxy start --state-dir D   # prints the endpoint URL
    python -m mailtap.dev.s3proxy stop --state-dir D

A started server keeps its objects in ``<state_dir>/objects``, so a stop and a start on the same
state dir (a store outage in a test) finds them again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from mailtap.dev import process
from mailtap.dev.errors import ServiceStartError
from mailtap.dev.layout import REPO_ROOT, TEMPLATES

#: Overrides the folder holding the resolved jars (default: ``.cache/s3proxy`` in the checkout).
ENV_S3PROXY_HOME = "MAILTAP_S3PROXY_HOME"
POM = TEMPLATES / "s3proxy" / "pom.xml"
#: The credentials of the local server (loopback only; a test passes them to the store).
ACCESS_KEY = "mailtap"
SECRET_KEY = "mailtap-local-secret"
#: S3Proxy answers in ~1 s here; a loaded 2-core CI box can take several times that.
START_TIMEOUT_S = 60.0
#: A cold resolution fetches ~130 jars.
BUILD_TIMEOUT_S = 900.0
JVM_OPTS = ("-Xmx256m", "-Xms32m", "-XX:+UseSerialGC", "-Djava.awt.headless=true")
LOGBACK = """<configuration>
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{HH:mm:ss.SSS} %-5level %logger{36} - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="STDOUT"/></root>
</configuration>
"""


def home() -> Path:
    return Path(os.environ.get(ENV_S3PROXY_HOME, REPO_ROOT / ".cache" / "s3proxy"))


def libs() -> Path:
    return home() / "libs"


def _stamp() -> Path:
    return home() / ".pom-sha256"


def _pom_digest() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()


def is_installed() -> bool:
    """True when ``build()`` has resolved the jars of the current pom."""
    return any(libs().glob("s3proxy-*.jar")) and (
        _stamp().is_file() and _stamp().read_text() == _pom_digest()
    )


def build(force: bool = False) -> Path:
    """Resolve S3Proxy and its dependencies into ``.cache/s3proxy/libs`` unless the pom is
    unchanged; swaps the folder in only when Maven succeeded. Returns the folder."""
    if is_installed() and not force:
        return libs()
    target = libs()
    staging = target.with_name("libs.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    process.maven(
        "s3proxy",
        [
            *("-f", str(POM), "dependency:copy-dependencies"),
            *(f"-DoutputDirectory={staging}", "-DincludeScope=runtime"),
        ],
        home() / "build.log",
        BUILD_TIMEOUT_S,
    )
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    _stamp().write_text(_pom_digest())
    return target


@dataclass(frozen=True)
class S3ProxyLayout:
    """Files of one S3Proxy process inside a state directory."""

    root: Path

    @property
    def properties(self) -> Path:
        return self.root / "s3proxy.properties"

    @property
    def objects(self) -> Path:
        return self.root / "objects"

    @property
    def logback(self) -> Path:
        return self.root / "logback.xml"

    @property
    def stdout_log(self) -> Path:
        return self.root / "s3proxy.log"

    @property
    def pid_file(self) -> Path:
        return self.root / "s3proxy.pid"


@dataclass(frozen=True)
class RunningS3Proxy:
    endpoint: str  # http://127.0.0.1:<port>, for claim_check.s3.endpoint_url
    pid: int  # also the process-group id
    port: int
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY

    @property
    def address(self) -> str:
        return self.endpoint


def probe(endpoint: str, timeout: float = 2.0) -> None:
    """Raise unless the server answers HTTP (an unsigned request gets 403: it is up)."""
    try:
        with urllib.request.urlopen(endpoint + "/", timeout=timeout):
            return
    except urllib.error.HTTPError as exc:
        if exc.code in (400, 403):
            return
        raise


def start(state_dir: Path, host: str = "127.0.0.1", port: int | None = None) -> RunningS3Proxy:
    """Start S3Proxy on ``host:port`` (a free port by default) and wait until it answers."""
    if not is_installed():
        raise ServiceStartError(
            f"s3proxy: not resolved ({libs()} is missing or stale); run `make s3proxy`"
        )
    layout = S3ProxyLayout(state_dir)
    layout.objects.mkdir(parents=True, exist_ok=True)
    port = port or process.free_port(host)
    endpoint = f"http://{host}:{port}"
    layout.properties.write_text(
        "\n".join(
            [
                f"s3proxy.endpoint={endpoint}",
                "s3proxy.authorization=aws-v2-or-v4",
                f"s3proxy.identity={ACCESS_KEY}",
                f"s3proxy.credential={SECRET_KEY}",
                "jclouds.provider=filesystem",
                f"jclouds.filesystem.basedir={layout.objects}",
                "",
            ]
        )
    )
    # The jar has no logback configuration, and logback's default logs every request at DEBUG.
    layout.logback.write_text(LOGBACK)
    argv = [
        process.java("s3proxy"),
        *JVM_OPTS,
        f"-Djava.io.tmpdir={state_dir}",
        f"-Dlogback.configurationFile={layout.logback}",
        "-cp",
        str(libs() / "*"),
        "org.gaul.s3proxy.Main",
        "--properties",
        str(layout.properties),
    ]
    pid = process.spawn(argv, layout.stdout_log, cwd=state_dir)
    layout.pid_file.write_text(str(pid))
    try:
        process.wait_until_ready(
            "s3proxy", pid, lambda: probe(endpoint), [layout.stdout_log], START_TIMEOUT_S, 0.1
        )
    except BaseException:
        stop(state_dir)
        raise
    return RunningS3Proxy(endpoint, pid, port)


def stop(state_dir: Path) -> bool:
    """Stop the S3Proxy started in ``state_dir``; True when one was running."""
    return process.stop_recorded(S3ProxyLayout(state_dir).pid_file)


def main(argv: list[str] | None = None) -> int:
    return process.service_main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
