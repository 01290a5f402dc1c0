"""``mailtap bench parse``: CPU per mail of what a parse process does, in this process.

The IMAP source builds its records in parse processes (:mod:`connectors.imap.parsepool`), about
half of ingest's CPU per mail; ``bench ingest`` measures them inside the whole pipeline, where
the spread of a shared machine hides changes of a few per cent. This runs their job,
``parsepool._build_batch`` (parse, key, content fingerprint, claim-check pack, Avro, key index
record) on batches of ``bench ingest``'s 4.7 KB mail, and times it with ``process_time``; the
baseline in the same run is the standard library's cheapest parse of the same bytes
(``email.message_from_bytes``, compat32, headers and body split, nothing decoded). For an A/B
run it alternately from two trees (``PYTHONPATH=<tree>``). ``--profile N`` prints cProfile's
``N`` costliest functions of one more pass.
"""

from __future__ import annotations

import cProfile
import datetime as dt
import email
import gc
import io
import pstats
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from connectors.core.config import ClaimCheckSettings, KafkaSettings
from connectors.core.mail import ParseLimits
from connectors.imap import parsepool
from connectors.imap.connection import FetchedMail
from connectors.imap.indexlog import ChangelogPartition
from connectors.imap.parsepool import BuilderSpec
from mailtap.bench.ingest import _mail

BATCH = 200
WARM_UP_BATCHES = 3


def _spec(claims: Path) -> BuilderSpec:
    return BuilderSpec(
        account="bench",
        folder="INBOX",
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9"),  # never contacted
        dlq_topic="mail.dlq",
        max_record_bytes=1_000_000,
        limits=ParseLimits(),
        claim_check=ClaimCheckSettings(url=claims.as_uri()),
        claim_check_threads=1,
        index_changelog=ChangelogPartition("mailtap.index", 0),
    )


def _batches(first_uid: int, mails: int) -> list[list[FetchedMail]]:
    moment = dt.datetime(2026, 12, 6, tzinfo=dt.UTC)
    fetched = [
        FetchedMail(uid, _mail("parse", uid), ("\\Seen",), moment, uid)
        for uid in range(first_uid, first_uid + mails)
    ]
    return [fetched[i : i + BATCH] for i in range(0, len(fetched), BATCH)]


def _cpu_us_per_mail(run: Any, batches: list[list[FetchedMail]]) -> float:
    started = time.process_time()
    for batch in batches:
        run(batch)
    return 1e6 * (time.process_time() - started) / sum(map(len, batches))


def bench_parse(mails: int = 6000, rounds: int = 5, profile: int = 0) -> dict[str, Any]:
    # As in a parse process (parsepool._init_child): the modules frozen, the young generation
    # collected every 10,000 allocations.
    gc.freeze()
    gc.set_threshold(parsepool._GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    spec = _spec(Path(tempfile.mkdtemp(prefix="mailtap-bench-parse-")))

    def build(batch: list[FetchedMail]) -> None:
        parsepool._build_batch(spec, batch, 17, 0)

    def stdlib(batch: list[FetchedMail]) -> None:
        for mail in batch:
            email.message_from_bytes(mail.raw)

    uid = 1
    for batch in _batches(uid, WARM_UP_BATCHES * BATCH):
        build(batch)
    uid += WARM_UP_BATCHES * BATCH
    ours, baseline = [], []
    for _ in range(rounds):
        batches = _batches(uid, mails)  # new UIDs each round: no cached blob
        uid += mails
        ours.append(_cpu_us_per_mail(build, batches))
        baseline.append(_cpu_us_per_mail(stdlib, batches))
    figures: dict[str, Any] = {
        "bench": "parse",
        "mail_bytes": len(_mail("parse", 1)),
        "mails_per_round": mails,
        "rounds": rounds,
        "build_us_per_mail": [round(v, 1) for v in ours],
        "build_us_per_mail_median": round(statistics.median(ours), 1),
        "stdlib_parse_us_per_mail": [round(v, 1) for v in baseline],
        "stdlib_parse_us_per_mail_median": round(statistics.median(baseline), 1),
        "ratio_to_stdlib_parse": round(
            statistics.median(o / b for o, b in zip(ours, baseline, strict=True)), 2
        ),
    }
    click.echo(
        f"parse process job (parse, key, fingerprint, claim check, Avro, index record): "
        f"{figures['build_us_per_mail_median']:.1f} µs CPU per mail (median of {rounds}); "
        f"email.message_from_bytes alone: {figures['stdlib_parse_us_per_mail_median']:.1f} µs; "
        f"ratio {figures['ratio_to_stdlib_parse']:.2f}",
        err=True,
    )
    if profile:
        profiler = cProfile.Profile()
        batches = _batches(uid, mails)
        profiler.enable()
        for batch in batches:
            build(batch)
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(profile)
        click.echo(out.getvalue(), err=True)
    return figures
