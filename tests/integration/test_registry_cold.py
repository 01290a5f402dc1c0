"""The local registry right after its start, as the components meet it in `make demo`: every
first registration, all at once, answered with an id.

Before (issue 29): on a fresh database, concurrent first registrations locked each other in
Apicurio's SQL storage until H2's lock timeout (30 s), then most of them failed with HTTP 500.
"""

from __future__ import annotations

import json
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mailtap.dev import registry

pytestmark = pytest.mark.skipif(
    not registry.is_installed(),
    reason=f"schema registry not built ({registry.run_jar()} missing); run `make registry`",
)

#: Components starting together (imap-source, streams, smtp-sink) register this many topics.
TOPICS = 6


@pytest.fixture
def fresh_registry() -> Iterator[str]:
    state_dir = Path(tempfile.mkdtemp(prefix="mailtap-test-registry-cold-"))
    running = registry.start(state_dir)
    try:
        yield running.url
    finally:
        assert registry.stop(state_dir)


def call(url: str, method: str, body: object | None = None) -> tuple[int, object]:
    request = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")[:300]


def prepare(url: str, topic: str) -> list[tuple[str, int, object]]:
    """What connectors.core.schemaregistry does for one topic, without its retries."""
    value = {
        "type": "record",
        "name": f"Value{topic[-1]}",
        "fields": [{"name": "id", "type": "long"}],
    }
    answers = []
    for subject, schema in ((f"{topic}-key", '"string"'), (f"{topic}-value", json.dumps(value))):
        status, body = call(f"{url}/config/{subject}", "PUT", {"compatibility": "FULL_TRANSITIVE"})
        answers.append((f"PUT /config/{subject}", status, body))
        status, body = call(f"{url}/subjects/{subject}/versions", "POST", {"schema": schema})
        answers.append((f"POST /subjects/{subject}/versions", status, body))
    return answers


def test_start_returns_once_a_registration_went_through_and_leaves_no_subject(
    fresh_registry: str,
) -> None:
    """The readiness probe registered its throwaway subject (the id sequence moved on) and
    deleted it, soft and permanently."""
    assert call(f"{fresh_registry}/subjects", "GET") == (200, [])
    assert call(f"{fresh_registry}/subjects?deleted=true", "GET") == (200, [])
    status, body = call(f"{fresh_registry}/subjects/x-value/versions", "POST", {"schema": '"long"'})
    assert status == 200 and isinstance(body, dict) and body["id"] > 1, body


def test_concurrent_first_registrations_on_a_fresh_registry_all_get_an_id(
    fresh_registry: str,
) -> None:
    topics = [f"mail.topic{n}" for n in range(TOPICS)]
    with ThreadPoolExecutor(TOPICS) as pool:
        answers = [
            a
            for per_topic in pool.map(lambda t: prepare(fresh_registry, t), topics)
            for a in per_topic
        ]

    failed = [(call_, status, body) for call_, status, body in answers if status != 200]
    assert failed == []
    key_ids = {body["id"] for call_, _, body in answers if call_.endswith("-key/versions")}  # type: ignore[index]
    assert len(key_ids) == 1  # one content "string", one id, under every T-key
    status, subjects = call(f"{fresh_registry}/subjects", "GET")
    assert status == 200 and sorted(subjects) == sorted(  # type: ignore[arg-type]
        f"{t}-{part}" for t in topics for part in ("key", "value")
    )
