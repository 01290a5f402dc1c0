"""`mailtap soak` as CI runs it: a short soak with a fixed seed on its own services (it kills the
broker, so never the session's). It fails on any violation the independent verifier reports;
the report holds every fault and figure. And a ``kill -9`` of the harness leaves nothing behind.

CI's soak is the issue's 5 minutes of faults with 20 mailboxes (not the default 100: CI's 2
shared cores), about 7-8 minutes of wall time with start-up, recovery and the final check.
A failing seed is kept here as a regression test (`REGRESSION_SEEDS`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from connectors.core.kafka.acls import Acl
from mailtap.dev import dovecot
from mailtap.dev.secure import PRINCIPALS
from mailtap.dev.secure_acls import bindings
from mailtap.soak.fleet import INSTANCES, component_of

CI_SEED = 11
#: Seeds that once found a bug (the fix has its own test): seed 4 crashed a streams worker
#: with IllegalStateError when the second worker joined during its re-seek, hung both SMTP
#: sinks in librdkafka's send_offsets_to_transaction after its broker kill
#: (connectors/core/kafka/watchdog.py), and tombstoned a mail appended to INBOX and moved to
#: Work at once after a handover (tests/integration/imap/test_imap_move_order.py).
REGRESSION_SEEDS = (4,)
#: Seeds that find a bug not fixed yet: run with ``MAILTAP_SOAK_OPEN_SEEDS=1`` (they are not
#: collected otherwise, so CI stays the judge of what is fixed). Seed 4 ended on slow-recovery
#: now and then: the sinks' librdkafka hang after its broker kill lasted until the watchdog's
#: 65 s; with 25 s (SEND_OFFSETS_TIMEOUT_S) it passed three runs in three (the third beside two
#: other soaks on 2 cores: recovered in 27 s), so it runs in CI again (docs/soak.md).
OPEN_SEEDS: tuple[int, ...] = ()
#: The secured soak's seed: its first fault is a broker kill (at ~21 s, down ~9 s; the first
#: fault depends on the seed alone), so the SCRAM users and ACLs are seen to survive a restart.
#: It also found the sink's own-bounce race once (two-final-deliveries [BOUNCED, UNKNOWN,
#: SUPPRESSED]; fixed, tests/integration/smtp/test_smtp_sink_scripted.py).
SECURED_SEED = 99
FIXED_SEEDS = tuple(s for s in REGRESSION_SEEDS if s not in OPEN_SEEDS)
SEEDS_RUN = REGRESSION_SEEDS if os.environ.get("MAILTAP_SOAK_OPEN_SEEDS") == "1" else FIXED_SEEDS


def _soak(
    tmp_path: Path,
    seed: int,
    minutes: float,
    mailboxes: int,
    step: float,
    extra: tuple[str, ...] = (),
) -> tuple[int, str, dict]:
    report = tmp_path / f"report-{seed}"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mailtap.cli",
            "soak",
            "--minutes",
            str(minutes),
            "--seed",
            str(seed),
            "--mailboxes",
            str(mailboxes),
            "--report",
            str(report),
            "--state-dir",
            str(tmp_path / f"state-{seed}"),
            "--step-seconds",
            str(step),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    output = result.stdout + result.stderr
    assert (report / "soak.json").exists(), (
        f"no report (exit {result.returncode}):\n{output[-5000:]}"
    )
    document = json.loads((report / "soak.json").read_text())
    return result.returncode, output, document


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    ("seed", "minutes", "mailboxes"),
    # A regression seed runs as long as it took to find its bug, with as many mailboxes.
    [(CI_SEED, 5, 20), *((seed, 1.5, 5) for seed in SEEDS_RUN)],
)
def test_a_short_soak_has_no_violation(
    tmp_path: Path, seed: int, minutes: float, mailboxes: int
) -> None:
    # One workload step every 2 s: what 7 components, Kafka, the registry and Dovecot keep up
    # with on CI's 2 cores (the lag rule judges the pipeline, not an overloaded machine).
    code, output, document = _soak(tmp_path, seed, minutes, mailboxes, step=2.0)
    lines = [line for line in output.splitlines() if line.strip()]
    assert document["violations"] == [], output[-5000:]
    assert code == 0, output[-5000:]
    assert lines[-1].startswith(f"PASS: seed {seed}"), lines[-1]
    # It did soak: faults were injected and recorded, mail went through, replies went out.
    assert document["faults"], "no fault injected"
    assert all({"at_s", "kind", "target"} <= set(f) for f in document["faults"])
    assert document["mails_appended"] > 10 * minutes
    assert document["verifier"]["commands"] > 5 * minutes
    assert document["verifier"]["relayed_mails"] > 5 * minutes
    assert document["recovery_s"] is not None and document["recovery_s"] <= 60
    # A sample every 5 s when the machine is quiet; on 2 loaded cores one took 9 s.
    assert len(document["samples"]) >= minutes * 60 / 15
    # The report a person reads: the plot beside the JSON (matplotlib comes with `.[dev]`).
    png = tmp_path / f"report-{seed}" / "soak.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "no plot"


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("mode", ["scram", "mtls"])
def test_a_secured_soak_has_no_violation(tmp_path: Path, mode: str) -> None:
    """The same fleet and faults on a broker secured like a company's (issue 25): each
    component logs in as its principal (SCRAM-SHA-512 over SASL_SSL, or a client certificate)
    and holds only the ACLs `mailtap acls` prints for its config; the broker refused none of
    their operations (an ``acl-denied`` violation otherwise)."""
    code, output, document = _soak(tmp_path, SECURED_SEED, 2, 3, step=2.0, extra=("--secure", mode))
    assert document["violations"] == [], output[-5000:]
    assert code == 0, output[-5000:]
    assert document["secure"] == mode
    assert "broker-kill" in {f["kind"] for f in document["faults"]}
    assert document["verifier"]["commands"] > 0 and document["verifier"]["relayed_mails"] > 0
    state = tmp_path / f"state-{SECURED_SEED}"
    protocol = {"scram": "SASL_SSL", "mtls": "SSL"}[mode]
    expected: dict[str, set[str]] = {}
    for instance in INSTANCES:
        config = state / f"{instance}.yaml"
        assert yaml.safe_load(config.read_text())["kafka"]["security_protocol"] == protocol
        component = component_of(instance)
        principal = PRINCIPALS[component]
        printed = subprocess.run(
            [
                sys.executable,
                "-m",
                "mailtap.cli",
                "acls",
                "--component",
                component,
                "--format",
                "json",
                "--principal",
                principal,
                "-c",
                str(config),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        acls = [
            Acl(a["resource_type"], a["name"], a["operation"], a["pattern"])
            for a in json.loads(printed.stdout)["acls"]
        ]
        expected.setdefault(principal, set()).update(map(str, bindings(principal, acls)))
    held = {principal: set(acls) for principal, acls in document["acls_held"].items()}
    assert held == expected and all(expected.values())
    # The refusals were looked for where the broker writes them.
    assert (state / "kafka" / "authorizer.log").exists()


@pytest.mark.timeout(600)
def test_a_killed_harness_leaves_no_process_behind(tmp_path: Path) -> None:
    state = tmp_path / "state"
    harness = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mailtap.cli",
            "soak",
            "--minutes",
            "10",
            "--mailboxes",
            "2",
            "--state-dir",
            str(state),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    try:
        assert harness.stdout is not None
        for line in harness.stdout:
            seen.append(line)
            if "instances healthy" in line:
                break
        else:
            pytest.fail("the soak did not get its instances healthy:\n" + "".join(seen[-30:]))
    finally:
        harness.send_signal(signal.SIGKILL)
        harness.wait(30)
    markers = [str(state.resolve()).encode(), str(dovecot.dovecot_root(state.resolve())).encode()]
    deadline = time.monotonic() + 30
    left = _ours(markers)
    while left and time.monotonic() < deadline:
        time.sleep(1)
        left = _ours(markers)
    assert left == [], left


def _ours(markers: list[bytes]) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X") and any(m in cmdline for m in markers):
            found.append(f"{entry.name}: {cmdline[:150]!r}")
    return found
