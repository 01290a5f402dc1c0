"""The contract through Go's hamba/avro (v2.31), the Avro library of Go consumers: every schema
parses in one schema cache (shared types first), its parser refuses v1's union default (the bug
of the issue), schemas resolve both ways with every released version (hamba's
SchemaCompatibility), and a real record of each, written by mailtap's serde, decodes and
re-encodes to the same bytes.

Needs Go 1.24+ (the machine's toolchain; skipped, saying so, without one); the module comes
through the Go module proxy, pinned by go/go.sum, and the checker is built into .cache/avro-go.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import fastavro
import pytest

from connectors.core.avro.schemas import TOPIC_SCHEMAS, load_schema
from mailtap.dev.layout import REPO_ROOT
from tests.integration.core.test_java_avro import manifest
from tests.unit.core.contract_samples import SAMPLES

GO_SOURCES = Path(__file__).parent / "go"
GO_DEFAULT = "/usr/local/go/bin/go"
#: A cold build downloads the module and compiles it; warm, a couple of seconds.
BUILD_TIMEOUT_S = 600.0


def go_toolchain() -> str | None:
    """``go`` on PATH, else the Go distribution's usual place."""
    found = shutil.which("go")
    return found or (GO_DEFAULT if Path(GO_DEFAULT).is_file() else None)


pytestmark = pytest.mark.skipif(
    go_toolchain() is None,
    reason="no Go toolchain (go on PATH or /usr/local/go): Go is not a mailtap dependency",
)


def checker() -> Path:
    go = go_toolchain()
    assert go is not None
    binary = REPO_ROOT / ".cache" / "avro-go" / "avrocheck"
    # go build is incremental and caches by content: rebuilding each run costs ~1 s when warm.
    subprocess.run(
        [go, "build", "-o", str(binary), "."],
        cwd=GO_SOURCES,
        env={**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly"},
        check=True,
        capture_output=True,
        timeout=BUILD_TIMEOUT_S,
    )
    return binary


def run_go(work: Path) -> dict[str, Any]:
    plan = manifest(work)
    plan["out"] = str(work)
    (work / "manifest.json").write_text(json.dumps(plan))
    done = subprocess.run(
        [str(checker()), str(work / "manifest.json")],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads((work / "result.json").read_text())
    return result


def test_the_contract_holds_in_go_hamba_avro(tmp_path: Path) -> None:
    result = run_go(tmp_path)

    # hamba/avro's fingerprints keep logicalType in the canonical form, unlike the Avro
    # specification (Java, fastavro): they differ from those on the wire (schemas/README.md, Go).
    for name in TOPIC_SCHEMAS:
        go_fp = bytes.fromhex(result["fingerprints"][name])
        assert load_schema(name).fingerprint != go_fp, (
            f"{name}: hamba/avro now agrees; update README"
        )
    [refusal] = result["invalid"].values()
    assert refusal.startswith("REFUSED") and "auto_submitted" in refusal
    compat = result["compat"]
    assert compat.pop("BROKEN").startswith("INCOMPATIBLE")
    # hamba/avro cannot even load v1's ReplyCommand: no Go reader ever read it.
    for direction in ("BACKWARD", "FORWARD"):
        assert "auto_submitted" in compat.pop(f"ReplyCommand.v1.avsc {direction}")
    assert compat and set(compat.values()) == {"COMPATIBLE"}, compat
    for name in TOPIC_SCHEMAS:  # what Go wrote back decodes to the very record Python wrote
        written = io.BytesIO(Path(result["records"][name]["reencoded"]).read_bytes())
        assert fastavro.schemaless_reader(written, load_schema(name).parsed) == SAMPLES[name]()
    mail = result["records"]["MailEvent"]["value"]
    assert mail["subject"] == SAMPLES["MailEvent"]()["subject"]
    assert mail["from"]["io.mailtap.v1.Address"]["name"] == "Zoë Ünal"  # Go names the branch
    assert mail["change"] == "ADDED"
