"""A source as the separate process the kill -9 tests crash and restart: its command line, its
environment (this checkout on PYTHONPATH), and a restart that always ends."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def source_command(run: str, config: Mapping[str, Any], tmp_path: Path) -> list[str]:
    """``python -c`` calling ``run`` (``"mailtap.commands.ews:run_ews_source"``) with
    ``config``, written to ``tmp_path/mailtap.yaml``."""
    config_file = tmp_path / "mailtap.yaml"
    config_file.write_text(yaml.safe_dump(dict(config)))
    module, function = run.split(":")
    code = f"import sys; from {module} import {function}; {function}(sys.argv[1])"
    return [sys.executable, "-c", code, str(config_file)]


@contextmanager
def restarted(run: list[str], timeout: float) -> Iterator[subprocess.Popen[bytes]]:
    """``run`` started again (its stderr dropped); terminated and waited for on the way out."""
    proc = subprocess.Popen(run, env=ENV, cwd=REPO, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=timeout)
