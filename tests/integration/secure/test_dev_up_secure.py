"""`mailtap dev up --secure` as a user runs it: the written configs log in, a second `up` reuses
the running set, `down` stops every process it started.

Without the schema registry (``MAILTAP_DEV_REGISTRY=off``): it has nothing to do with Kafka's
security and would add the slowest JVM of the stack.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from connectors.core.config import load_config
from connectors.core.kafka.acls import Acl
from connectors.core.kafka.clients import admin_client, cluster_metadata
from mailtap.dev import down, process, status, up
from mailtap.dev.layout import ENV_DEV_REGISTRY
from mailtap.dev.process import group_members
from mailtap.dev.secure import MECHANISMS, PRINCIPALS
from mailtap.dev.secure_acls import GRANTED_AS, bindings, principal_bindings
from streams.config import StreamsSettings


def test_dev_up_secure_writes_configs_that_log_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_DEV_REGISTRY, "off")
    process.tie_services_to_this_process()  # a failing test leaves nothing running
    state_dir = Path(tempfile.mkdtemp(prefix="mailtap-dev-secure-"))
    state_dir.chmod(0o755)  # Dovecot's unprivileged processes reach the maildirs
    info = up(state_dir, secure=True)
    try:
        assert info.secure is not None
        assert info.secure.oauth_pid in info.pids
        written = {
            (component, mechanism): state_dir / "secure" / component / f"{mechanism}.yaml"
            for component in PRINCIPALS
            for mechanism in MECHANISMS
        }
        assert all(path.exists() for path in written.values())
        # Every mechanism of one component logs in with the config as written.
        for mechanism in MECHANISMS:
            kafka = load_config(written[("smtp-sink", mechanism)], env={}).kafka
            metadata = cluster_metadata(admin_client(kafka), kafka, 30)
            assert list(metadata.brokers) == [1], mechanism
        # The streams worker starts from its configs as written (faust over aiokafka).
        streams = load_config(written[("streams", "oauthbearer")], env={})
        assert streams.section("streams", StreamsSettings).app_id == "mailtap-dev"
        # The plain config uses the admin listener: a super user can create topics there.
        assert load_config(info.config_path, env={}).kafka.security_protocol == "PLAINTEXT"

        # Exactly the ACLs `mailtap acls` prints for each component's written config.
        admin = AdminClient({"bootstrap.servers": info.secure.admin_bootstrap})
        for component, as_component in GRANTED_AS.items():
            principal = PRINCIPALS[component]
            printed = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "mailtap.cli",
                    "acls",
                    "--component",
                    as_component,
                    "--format",
                    "json",
                    "--principal",
                    principal,
                    "-c",
                    str(written[(component, "scram-sha-512")]),
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
            expected = bindings(principal, [_acl(a) for a in json.loads(printed.stdout)["acls"]])
            held = principal_bindings(admin, principal)
            assert expected and sorted(map(str, held)) == sorted(map(str, expected)), component
        assert principal_bindings(admin, PRINCIPALS["admin"]) == []  # a super user

        assert status(state_dir) == info
        again = up(state_dir, secure=True)
        assert again.pids == info.pids  # reused, not restarted
    finally:
        stopped = down(state_dir)
        leftovers = {pid: group_members(pid) for pid in info.pids if group_members(pid)}
        shutil.rmtree(state_dir, ignore_errors=True)
    assert sorted(stopped) == sorted(info.pids)
    assert leftovers == {}


def _acl(printed: dict[str, str]) -> Acl:
    return Acl(
        printed["resource_type"],  # type: ignore[arg-type]
        printed["name"],
        printed["operation"],  # type: ignore[arg-type]
        printed["pattern"],  # type: ignore[arg-type]
    )
