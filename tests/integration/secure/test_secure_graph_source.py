"""The Microsoft Graph source on the secured broker (issue 23): as the IMAP and EWS sources, it
checks its Kafka permissions at start, so a missing ACL is one sentence naming the operation, the
resource and the kafka-acls command, before it reads a mail or writes anything; with exactly
the ACLs ``mailtap acls`` computes for it, it publishes.

A few cases only (not every ACL left out in turn, as tests/integration/secure/
test_secure_permissions.py does for the other components: that costs minutes): the computed
set, a topic it writes (Write on ``mail.events``) and a group it reads with (Describe on the
offsets reader's group). The runs use the same machinery (`acl_cases.Runner`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from connectors.core.config import KafkaSettings, MailtapConfig
from connectors.core.kafka.topics import ensure_topics
from mailtap.dev.secure import SecureKafka
from tests.graph_server import GraphTestServer
from tests.graph_server.fixture import USER, running_server
from tests.integration.graph.graph_kafka import mime, source_config
from tests.integration.secure.acl_cases import (
    Run,
    Runner,
    Subject,
    kafka_section,
    records_on,
)
from tests.integration.secure.test_secure_permissions import RUNS_TIMEOUT_S, _refused, _works

_NOWHERE = "127.0.0.1:9"
CASES = [
    "Write-topic-mail.events.U",
    "Describe-group-mailtap-offsets-reader",
]


def graph_subject(bootstrap: str, graph: GraphTestServer | None) -> Subject:
    def config(unique: str, run_dir: Path) -> dict[str, Any]:
        unused = KafkaSettings(bootstrap_servers=bootstrap)
        raw = source_config(unused, graph, run_dir / "claims") if graph else _offline(unused)
        account = raw["graph"]["accounts"][0]
        account["name"] = f"ms-{unique}"
        raw["kafka"] = kafka_section(bootstrap, unique)
        raw["health"] = {"port": 0, "max_sync_age_seconds": 600}
        # A refused mailbox retries at the cap: no second line while it is watched.
        raw["graph"].update(backoff_initial_seconds=30, backoff_cap_seconds=60)
        return raw

    def prepare(cfg: MailtapConfig, run_dir: Path) -> None:
        ensure_topics(cfg.kafka, retry_tiers=[])

    def outputs(cfg: MailtapConfig, run_dir: Path) -> dict[str, int]:
        t = cfg.kafka.topics
        return {
            "events": records_on(cfg.kafka, [t.events]),
            "cursor": records_on(cfg.kafka, [t.offsets]),
        }

    return Subject("graph-source", "mailtap-graph-source", config, prepare, outputs)


def _offline(kafka: KafkaSettings) -> dict[str, Any]:
    """A config to compute the case ids with (no server runs at collection)."""
    return {
        "kafka": {},
        "graph": {
            "tenant_id": "t",
            "client_id": "c",
            "client_secret": "s",
            "accounts": [{"name": "ms", "user": USER}],
        },
    }


@pytest.fixture(scope="module")
def graph() -> Iterator[GraphTestServer]:
    with running_server() as server:
        server.add_message(USER, mime(1))
        yield server


@pytest.fixture(scope="module")
def graph_runs(  # type: ignore[no-untyped-def]
    secure_kafka: SecureKafka, admin: AdminClient, graph: GraphTestServer, tmp_path_factory
) -> dict[str, Run]:
    subject = graph_subject(secure_kafka.admin_bootstrap, graph)
    folder = tmp_path_factory.mktemp(subject.component)
    return Runner(subject, secure_kafka, admin, folder).run_all([*CASES, "all"])


def test_the_cases_are_computed_acls_of_the_graph_source() -> None:
    assert set(CASES) <= set(graph_subject(_NOWHERE, None).case_ids())


@pytest.mark.timeout(RUNS_TIMEOUT_S)
def test_graph_source_with_exactly_the_computed_acls_publishes(graph_runs: dict[str, Run]) -> None:
    _works(graph_runs["all"])


@pytest.mark.timeout(RUNS_TIMEOUT_S)
@pytest.mark.parametrize("case", CASES)
def test_graph_source_without_one_acl_says_so_at_start(
    graph_runs: dict[str, Run], case: str
) -> None:
    run = graph_runs[case]
    _refused(run)
    assert run.returncode == 1, run.text  # refused at start: it stops, it does not back off
