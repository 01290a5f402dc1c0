"""Apache Avro (Java) for the contract tests: the jars resolved from Maven Central with ``mvn``
into ``.cache/avro-java/<version>/libs`` (as mailtap.dev resolves the Kafka broker), and
``java/AvroContractCheck.java`` compiled against them and run on a manifest.

The first run per version downloads ~12 jars (about a minute here); later runs reuse them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from mailtap.dev import process
from mailtap.dev.layout import REPO_ROOT

#: The Avro lines the contract must work with (DESIGN.md: "Java 1.11+"): the newest of each.
AVRO_VERSIONS = ("1.11.5", "1.12.2")
JAVA_SOURCES = Path(__file__).parent / "java"
CHECKER = JAVA_SOURCES / "AvroContractCheck.java"
#: A cold resolution fetches the Maven dependency plugin and ~12 jars.
RESOLVE_TIMEOUT_S = 900.0
#: A JVM start, code generation and javac of ~16 generated classes on a loaded 2-core box.
RUN_TIMEOUT_S = 600.0


def _home(version: str) -> Path:
    return REPO_ROOT / ".cache" / "avro-java" / version


def _digest(*files: Path) -> str:
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.read_bytes())
    return digest.hexdigest()


def resolve(version: str) -> Path:
    """The folder of Avro ``version``'s jars (avro, avro-compiler and their dependencies)."""
    home = _home(version)
    libs = home / "libs"
    stamp = home / ".pom-sha256"
    want = _digest(JAVA_SOURCES / "pom.xml")
    if (libs / f"avro-{version}.jar").is_file() and stamp.is_file() and stamp.read_text() == want:
        return libs
    staging = home / "libs.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    with tempfile.TemporaryDirectory() as work:  # Maven may write target/ next to the pom
        shutil.copy(JAVA_SOURCES / "pom.xml", work)
        process.maven(
            f"avro-java {version}",
            [
                "dependency:copy-dependencies",
                f"-Davro.version={version}",
                f"-DoutputDirectory={staging}",
            ],
            home / "resolve.log",
            RESOLVE_TIMEOUT_S,
            cwd=Path(work),
        )
    shutil.rmtree(libs, ignore_errors=True)
    staging.rename(libs)
    stamp.write_text(want)
    return libs


def _classpath(*parts: Path | str) -> str:
    return ":".join(str(p) for p in parts)


def compiled(version: str) -> tuple[Path, Path]:
    """(checker classes, libs) for ``version``, compiling the checker when its source changed."""
    libs = resolve(version)
    classes = _home(version) / "checker"
    stamp = _home(version) / ".checker-sha256"
    want = _digest(CHECKER)
    if not (stamp.is_file() and stamp.read_text() == want):
        shutil.rmtree(classes, ignore_errors=True)
        classes.mkdir(parents=True)
        javac = Path(process.java("avro-java")).with_name("javac")
        subprocess.run(
            [str(javac), "-nowarn", "-cp", f"{libs}/*", "-d", str(classes), str(CHECKER)],
            check=True,
            capture_output=True,
            timeout=RUN_TIMEOUT_S,
        )
        stamp.write_text(want)
    return classes, libs


def run_checker(version: str, manifest: dict[str, Any], work: Path) -> dict[str, Any]:
    """Run AvroContractCheck on ``manifest`` (see its Javadoc) and return its result."""
    classes, libs = compiled(version)
    out = work / f"java-{version}"
    out.mkdir(parents=True, exist_ok=True)
    manifest_file = out / "manifest.json"
    manifest_file.write_text(json.dumps({**manifest, "out": str(out)}))
    done = subprocess.run(
        [
            process.java("avro-java"),
            "-Xmx256m",
            # Avro 1.12 instantiates only classes of trusted packages (CVE-2024-47561); a consumer
            # with generated mailtap classes sets the same (schemas/README.md, "Java").
            "-Dorg.apache.avro.SERIALIZABLE_PACKAGES=io.mailtap.v1",
            "-cp",
            _classpath(classes, f"{libs}/*"),
            "AvroContractCheck",
            str(manifest_file),
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"AvroContractCheck (Avro {version}) failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    return result


def maven_codegen(version: str, schemas: Path, work: Path) -> Path:
    """Run avro-maven-plugin ``version`` (configured as schemas/README.md says) on ``schemas``
    and compile what it generates; returns the Maven project's ``target``."""
    shutil.copy(JAVA_SOURCES / "codegen-pom.xml", work / "pom.xml")
    process.maven(
        f"avro-maven-plugin {version}",
        ["compile", f"-Davro.version={version}", f"-Dschemas={schemas}"],
        work / "maven.log",
        RESOLVE_TIMEOUT_S,
        cwd=work,
    )
    return work / "target"
