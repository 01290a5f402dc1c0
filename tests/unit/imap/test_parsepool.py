"""What crosses the pipe between the source and its parse processes, and how those run."""

from __future__ import annotations

import dataclasses
import datetime as dt
import gc
import pickle
from pathlib import Path

from connectors.core.config import ClaimCheckSettings, KafkaSettings
from connectors.core.kafka.transactions import SourceRecord
from connectors.core.mail import ParseLimits
from connectors.imap import parsepool
from connectors.imap.connection import FetchedMail
from connectors.imap.indexlog import ChangelogPartition
from connectors.imap.parsepool import BuilderSpec, ParsePool
from connectors.imap.records import BuiltMail, ParsedBatch
from tests.unit.core.test_avro_writer import _corpus


def _batch() -> ParsedBatch:
    event = SourceRecord("mail.events", b"a/mid:1@example.com", b"\xc3\x01avro")
    dlq = SourceRecord(
        "mail.dlq",
        b"a/mid:1@example.com",
        b"raw mime",
        (("mailtap.error.kind", b"parse_error"), ("mailtap.source.uid", b"7")),
    )
    index = SourceRecord("mailtap.index", b"a/mid:1@example.com|INBOX", b"{}", partition=3)
    return ParsedBatch(
        [
            BuiltMail(
                7, "a/mid:1@example.com", "1@example.com", (event, dlq, index), True, "f" * 64
            ),
            # A mail the parser could not turn into an event: a DLQ report only, no key.
            BuiltMail(8, None, None, (SourceRecord("mail.dlq", b"a/INBOX/1/8", b""),), dlq=True),
            BuiltMail(
                9, "a/fp:" + "0" * 64, None, (SourceRecord("mail.events", b"k", None),), False
            ),
        ],
        ("/claims/pack/x.pack",),
    )


def test_a_parsed_batch_comes_back_from_the_pipe_equal_and_of_the_same_types() -> None:
    batch = _batch()

    copy = pickle.loads(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL))

    assert copy == batch
    assert [type(mail) for mail in copy.mails] == [BuiltMail] * 3
    assert {type(r) for mail in copy.mails for r in mail.records} == {SourceRecord}
    assert copy.mails[0].records[1].headers == batch.mails[0].records[1].headers
    assert copy.mails[0].records[2].partition == 3


def test_the_corpora_built_in_a_parse_process_reach_the_source_byte_for_byte(
    tmp_path: Path,
) -> None:
    # The fixture corpora and the hostile mails, built as a parse process builds them: their
    # events, DLQ reports (headers included) and key index records come back unchanged.
    spec = BuilderSpec(
        account="ops",
        folder="INBOX",
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9"),
        dlq_topic="mail.dlq",
        max_record_bytes=1_000_000,
        limits=ParseLimits(max_attachments=50),
        claim_check=ClaimCheckSettings(url=tmp_path.as_uri()),
        claim_check_threads=1,
        index_changelog=ChangelogPartition("mailtap.index", 2),
    )
    moment = dt.datetime(2026, 12, 5, tzinfo=dt.UTC)
    mails = [
        FetchedMail(uid, raw, ("\\Seen",), moment, uid + 10)
        for uid, (_, raw) in enumerate(_corpus(), 1)
    ]
    built = parsepool._build_batch(spec, mails, 17, 0)

    copy = pickle.loads(pickle.dumps(built, protocol=pickle.HIGHEST_PROTOCOL))

    assert copy == built
    records = [r for mail in built.mails for r in mail.records]
    assert {r.topic for r in records} == {"mail.events", "mail.dlq", "mailtap.index"}
    assert [(r.key, r.value, tuple(r.headers)) for m in copy.mails for r in m.records] == [
        (r.key, r.value, tuple(r.headers)) for r in records
    ]


def test_the_flattened_batch_holds_every_field_of_its_mails_and_records() -> None:
    # ParsedBatch.__reduce__ lists the fields by hand: a field added to either class must be
    # added there too, or it would come back from a parse process with its default.
    assert [f.name for f in dataclasses.fields(BuiltMail)] == [
        "uid",
        "key",
        "message_id",
        "records",
        "dlq",
        "fingerprint",
    ]
    assert [f.name for f in dataclasses.fields(SourceRecord)] == [
        "topic",
        "key",
        "value",
        "headers",
        "partition",
    ]


def test_a_parse_process_runs_with_its_modules_frozen_and_a_higher_gc_threshold() -> None:
    pool = ParsePool(1)
    try:
        pool.warm_up()
        executor = pool._running()
        threshold = executor.submit(gc.get_threshold).result(timeout=60)
        frozen = executor.submit(gc.get_freeze_count).result(timeout=60)
    finally:
        pool.close()
    assert threshold[0] == parsepool._GC_YOUNG_THRESHOLD
    assert frozen > 0
    assert gc.get_threshold()[0] != parsepool._GC_YOUNG_THRESHOLD  # the source's own is untouched
