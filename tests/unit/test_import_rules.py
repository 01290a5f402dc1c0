"""The import rules of DESIGN.md ("Dependency direction"), as the import-linter contracts in
pyproject.toml ([tool.importlinter]) state them, hold for the product code; and each contract
does break when its rule is broken (a copy of the tree with forbidden imports added)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("connectors", "streams", "mailtap")
#: lint-imports of the venv that runs the tests (the dev extra installs it).
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    assert LINT_IMPORTS.is_file(), f"{LINT_IMPORTS} missing: pip install -e '.[dev]'"
    # It puts its working directory first on sys.path: the packages of ``root`` are analysed.
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_product_keeps_every_import_contract() -> None:
    done = _lint_imports(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


#: (module file to extend, the line added, what lint-imports must name in its report)
VIOLATIONS = [
    # connectors.core imports no connector
    ("connectors/core/errors.py", "import connectors.imap.errors", "connectors.core.errors -> connectors.imap.errors"),
    # no connector imports another
    ("connectors/ews/errors.py", "import connectors.smtp.errors", "connectors.ews.errors -> connectors.smtp.errors"),
    # streams imports only connectors.core
    ("streams/guards.py", "import connectors.smtp.errors", "streams.guards -> connectors.smtp.errors"),
    # nothing below mailtap imports it
    ("streams/mail.py", "import mailtap.cli", "streams.mail -> mailtap.cli"),
    # kafka/, avro/ and claimcheck/ import nothing from source/
    ("connectors/core/kafka/log.py", "import connectors.core.source.records", "connectors.core.kafka.log -> connectors.core.source.records"),
    # mail/ imports nothing from kafka/
    ("connectors/core/mail/charsets.py", "import connectors.core.kafka.log", "connectors.core.mail.charsets -> connectors.core.kafka.log"),
    # the soak's verifier shares no code with the writers it checks
    ("mailtap/soak/verifier.py", "import connectors.core.errors", "mailtap.soak.verifier -> connectors.core.errors"),
    # a cycle behind an import in a function is still a cycle
    ("connectors/core/errors.py", "def _later() -> None:\n    import connectors.core.config", ".errors -> .config"),
]  # fmt: skip


def test_each_contract_breaks_when_its_rule_is_broken(tmp_path: Path) -> None:
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    for package in PACKAGES:
        shutil.copytree(
            REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    for file, line, _ in VIOLATIONS:
        with (tmp_path / file).open("a", encoding="utf-8") as module:
            module.write(f"\n{line}\n")
    # A connector nobody declared in the rules.
    (tmp_path / "connectors" / "fax").mkdir()
    (tmp_path / "connectors" / "fax" / "__init__.py").write_text("", encoding="utf-8")

    done = _lint_imports(tmp_path)

    report = done.stdout
    assert done.returncode == 1, report + done.stderr
    assert "0 kept, 6 broken" in report
    missing = [shown for _, _, shown in VIOLATIONS if shown not in report]
    assert missing == [], report
    assert "connectors.fax" in report
