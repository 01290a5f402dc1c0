"""deploy/observability: the alert rules load in Prometheus (``promtool check rules``), fire on the
series they are meant for (``promtool test rules``), and the dashboard's queries name metrics the
components define. That a running component exports them is checked by
tests/integration/pipeline/test_operate.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
OBS = REPO / "deploy" / "observability"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (Debian package 'prometheus'; deploy/bootstrap.sh installs it)",
)


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    result = subprocess.run(
        [str(PROMTOOL), "check", "rules", str(OBS / "mailtap-alerts.yaml")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_alerts_fire_on_their_series() -> None:
    result = subprocess.run(
        [str(PROMTOOL), "test", "rules", "mailtap-alerts.test.yaml"],
        capture_output=True,
        text=True,
        cwd=OBS,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def used_metric_names() -> set[str]:
    exprs = [
        r["expr"]
        for g in yaml.safe_load((OBS / "mailtap-alerts.yaml").read_text())["groups"]
        for r in g["rules"]
    ]
    dashboard = json.loads((OBS / "mailtap-dashboard.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    return {n for e in exprs for n in re.findall(r"\b(mailtap_[a-z_]+)\b", e)}


def test_every_queried_metric_is_defined_by_a_component() -> None:
    sources = "\n".join(
        p.read_text()
        for d in ("connectors", "mailtap", "streams")
        for p in (REPO / d).rglob("*.py")
    )
    defined = set(re.findall(r'"(mailtap_[a-z_]+)"', sources))
    defined |= {f"mailtap_{n}" for n in re.findall(r'f"\{prefix\}_([a-z_]+)"', sources)}
    defined |= {f"mailtap_smtp_{n}" for n in re.findall(r'f"\{prefix\}_([a-z_]+)"', sources)}
    used = {n.removesuffix("_total") for n in used_metric_names()}
    assert used, "no metric found in the rules and dashboard"
    assert not used - defined, sorted(used - defined)
