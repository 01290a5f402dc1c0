"""What ``mailtap run imap-source`` imports before its first FETCH decides much of its start-up
(issue 12: start -> first FETCH within 1.5 s). Libraries only some configurations use are
imported when used; these tests fail when one of them comes back on the common path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]

#: Exactly what ``mailtap run imap-source`` imports before it reads its config.
START_MODULES = "mailtap.cli, mailtap.commands.run, mailtap.commands.imap"

#: Used only by some configurations, imported when they are.
LAZY = {
    "requests": "XOAUTH2 client-credentials grant (oauth2: in an account)",
    "oauthlib": "XOAUTH2 client-credentials grant (oauth2: in an account)",
    "requests_oauthlib": "XOAUTH2 client-credentials grant (oauth2: in an account)",
    # Issue 29 (first event <= 1 s after the start): what other components or formats need.
    "pythonjsonlogger": "--log-format json",
    "connectors.smtp": "the SMTP sink (its settings: an smtp section)",
    "faust": "the streams worker",
    "exchangelib": "the EWS source",
    "msal": "the Graph source and the Graph transport of the sink",
    "matplotlib": "mailtap soak's report",
    "fastapi": "mailtap run console",
    "aiosmtplib": "the SMTP sink",
}


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after ``code`` (a fresh one: this test process has
    imported everything already)."""
    program = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_the_imap_source_start_leaves_optional_libraries_unimported() -> None:
    loaded = _modules_after(f"import {START_MODULES}")
    assert "connectors.imap.source" in loaded  # the import under test did happen
    early = {name: why for name, why in LAZY.items() if name in loaded}
    assert early == {}, f"imported on every imap-source start, though only needed for: {early}"


def test_the_oauth2_login_still_finds_its_libraries() -> None:
    loaded = _modules_after(
        f"import {START_MODULES}\nfrom connectors.core.oauth2 import client_credentials"
    )
    assert {"requests", "oauthlib", "requests_oauthlib"} <= loaded
