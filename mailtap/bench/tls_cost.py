"""The cost of a secured listener: ``mailtap bench ingest --secure MECHANISM``.

Each round ingests a fresh mailbox twice into the *same* broker: once over its PLAINTEXT
listener, once over a secured one (SASL_SSL with SCRAM-SHA-512, SSL with a client certificate,
or SASL_SSL with OAUTHBEARER), so that the ratio measures TLS and the login, not two different
brokers. The secured broker is the one of ``mailtap dev up --secure`` when the running services
have it, else one started for the run (`mailtap.dev.secure.start_standalone`) next to the
running IMAP server. The source connects as ``mailtap-admin`` (a super user): the authorizer
still checks every request, without an ACL set to keep in step with the bench's topic names.

The figure is ``sasl_ssl_to_plaintext_ratio_median``: ingest rate over the secured listener ÷
over PLAINTEXT, the median of the rounds (the order alternates, since the machine is shared).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from mailtap.bench.ingest import _round, _say, _warm_broker, services_with
from mailtap.dev import DevServices, process, secure
from mailtap.dev.secure import SecureKafka

#: ``--secure`` choices -> the mechanism names of `SecureKafka.kafka_section`.
MECHANISMS = {"scram": "scram-sha-512", "mtls": "mtls", "oauthbearer": "oauthbearer"}
#: The principal the source connects as: a super user of the secured broker.
PRINCIPAL = "admin"


@contextmanager
def secured(info: DevServices) -> Iterator[tuple[DevServices, SecureKafka]]:
    """``info`` pointed at a secured broker's PLAINTEXT listener, and that broker."""
    if info.secure is not None:
        yield info, info.secure
        return
    _say("the running services have no secured broker: starting one for this run ...")
    folder = Path(tempfile.mkdtemp(prefix="mailtap-bench-secure-"))
    started, pids = secure.start_standalone(folder, info.imap.host)
    try:
        kafka = replace(info.kafka, bootstrap_servers=started.admin_bootstrap, pid=None)
        yield replace(info, kafka=kafka, secure=started), started
    finally:
        for pid in pids:
            process.stop_group(pid)
        shutil.rmtree(folder, ignore_errors=True)


def tls_cost_rounds(
    info: DevServices, mails: int, rounds: int, warm_up_s: float, mechanism: str
) -> dict[str, Any]:
    with secured(info) as (plain, broker):
        client = broker.kafka_section(PRINCIPAL, MECHANISMS[mechanism])
        warm_up = _warm_broker(plain, warm_up_s) if warm_up_s > 0 else None
        results = []
        for number in range(1, rounds + 1):
            _say(f"round {number} of {rounds}: PLAINTEXT and {client['security_protocol']}")
            order = [None, client] if number % 2 else [client, None]
            rates: dict[str, float] = {}
            for over in order:
                figures = _round(plain, mails, idle=False, client=over)
                name = "plaintext" if over is None else "secured"
                rates[f"{name}_ingest_mails_per_s"] = figures["ingest_mails_per_s"]
            rates["ratio"] = round(
                rates["secured_ingest_mails_per_s"] / rates["plaintext_ingest_mails_per_s"], 3
            )
            results.append(rates)
    return {
        "mechanism": f"{client['security_protocol']} {client.get('sasl_mechanism', 'mTLS')}",
        "mails": mails,
        "broker_warm_up": warm_up,
        "rounds": results,
        "sasl_ssl_to_plaintext_ratio_median": statistics.median(r["ratio"] for r in results),
    }


def bench_tls_cost(
    json_out: bool, mails: int, rounds: int, warm_up_s: float, imap_server: str, mechanism: str
) -> dict[str, Any]:
    with services_with(imap_server) as info:
        figures = tls_cost_rounds(info, mails, rounds, warm_up_s, mechanism)
    if not json_out:
        for name, value in figures.items():
            print(f"{name:40s} {value}")
    return figures
