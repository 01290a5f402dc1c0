"""The streams worker's OAUTHBEARER token provider keeps a token while it is fresh, fetches a new
one before it expires, and the broker accepts the new one.

A second dev OAuth server issues tokens that live 20 s (the session's lives an hour), signed with
the same key and issuer, so the secured broker accepts them: the provider refreshes at half the
lifetime (`connectors.core.oauth2`), here after 10 s.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from mailtap.dev import process
from mailtap.dev.secure import OAUTH_AUDIENCE, SecureKafka, probe_token_endpoint
from streams.kafka_security import ClientCredentialsTokenProvider, aiokafka_security
from tests.integration.secure.conftest import KafkaSettingsFor

LIFETIME_S = 20


def _claims(token: str) -> dict[str, object]:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))  # type: ignore[no-any-return]


@pytest.fixture
def short_token_url(secure_kafka: SecureKafka) -> Iterator[str]:
    port, jwks_port = process.free_ports(2)
    folder = Path(secure_kafka.ca_location).parents[1] / "oauth"
    issuer = secure_kafka.token_url.removesuffix("/token")  # the broker expects this issuer
    argv = [sys.executable, "-m", "mailtap.dev.oauth_server", "--folder", str(folder)]
    argv += ["--token-port", str(port), "--jwks-port", str(jwks_port), "--issuer", issuer]
    argv += ["--audience", OAUTH_AUDIENCE, "--token-lifetime", str(LIFETIME_S)]
    server = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=process.die_with_parent(),  # gone with the session, however it ends
    )
    url = f"https://127.0.0.1:{port}/token"
    try:
        process.wait_until_ready(
            "short-lived oauth server",
            server.pid,
            lambda: probe_token_endpoint(url, secure_kafka.ca_location),
            [],
            30,
        )
        yield url
    finally:
        server.terminate()
        server.wait(10)


async def test_tokens_are_refreshed_before_they_expire_and_accepted(
    secure_kafka: SecureKafka, kafka_settings: KafkaSettingsFor, short_token_url: str
) -> None:
    section = secure_kafka.kafka_section("streams", "oauthbearer")
    oauth = {**section["sasl_oauthbearer"], "token_url": short_token_url}
    kafka = kafka_settings("streams", "oauthbearer", sasl_oauthbearer=oauth)
    assert kafka.sasl_oauthbearer is not None
    provider = ClientCredentialsTokenProvider(kafka.sasl_oauthbearer)

    first = await provider.token()
    assert await provider.token() == first  # fresh: kept
    assert _claims(first)["sub"] == "mailtap-streams"
    await asyncio.sleep(LIFETIME_S / 2 + 0.5)
    second = await provider.token()
    assert second != first
    assert int(_claims(second)["exp"]) > int(_claims(first)["exp"])  # type: ignore[call-overload]

    # The broker accepts what the provider hands aiokafka now.
    options = aiokafka_security(kafka)
    options["sasl_oauth_token_provider"] = provider
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, **options)
    await producer.start()
    try:
        metadata = await producer.client.fetch_all_metadata()
        assert [b.nodeId for b in metadata.brokers()] == [1]
    finally:
        await producer.stop()
