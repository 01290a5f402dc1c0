"""``make test`` runs with MAILTAP_NO_SKIP=1: a test that would skip fails, so CI cannot pass by
skipping what needs podman, Go, Java or a server the project installs (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import pytest

def test_skips_inside():
    pytest.skip("no such tool here")

@pytest.mark.skipif(True, reason="marked to skip")
def test_marked_to_skip():
    pass

def test_passes():
    pass
"""


def _run(tmp_path: Path, no_skip: bool) -> subprocess.CompletedProcess[str]:
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "MAILTAP_NO_SKIP"}
    if no_skip:
        env["MAILTAP_NO_SKIP"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:randomly",
         "--rootdir", str(tmp_path), "-c", os.devnull, str(probe)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_under_make_test_a_skip_is_a_failure_naming_its_reason(tmp_path: Path) -> None:
    result = _run(tmp_path, no_skip=True)
    assert result.returncode == 1, result.stdout
    assert "1 failed, 1 passed, 1 error" in result.stdout
    assert result.stdout.count("MAILTAP_NO_SKIP=1 (make test): this test may not skip") == 2
    assert "no such tool here" in result.stdout and "marked to skip" in result.stdout


def test_elsewhere_a_skip_stays_a_skip(tmp_path: Path) -> None:
    result = _run(tmp_path, no_skip=False)
    assert result.returncode == 0, result.stdout
    assert "1 passed, 2 skipped" in result.stdout
