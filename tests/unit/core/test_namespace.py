"""kafka.namespace: every name mailtap makes up derives from it; explicit names win."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from connectors.core.config import MailtapConfig
from connectors.core.source.location import SourceLocation
from connectors.smtp.config import SmtpSinkSettings
from streams.config import StreamsSettings

SMTP = {"host": "relay.example", "from_address": "noreply@example.com", "security": "plain"}
STREAMS = {"from_address": {"address": "support@example.com"}}


def config(kafka: dict[str, object], **sections: object) -> MailtapConfig:
    return MailtapConfig.model_validate(
        {"kafka": {"bootstrap_servers": "k:9092", **kafka}, **sections}
    )


def test_every_default_topic_is_inside_the_namespace() -> None:
    topics = config({"namespace": "prod"}).kafka.topics
    assert topics.events == "prod.mail.events"
    assert topics.offsets == "prod.mailtap.offsets"
    assert topics.retry_prefix == "prod.mail.commands.retry"
    assert all(name.startswith("prod.") for name in topics.model_dump().values())


def test_an_explicit_topic_name_wins() -> None:
    topics = config({"namespace": "prod", "topics": {"events": "orders.mail"}}).kafka.topics
    assert topics.events == "orders.mail"
    assert topics.commands == "prod.mail.commands"


def test_without_a_namespace_the_names_are_the_documented_defaults() -> None:
    cfg = config({}, smtp=SMTP, streams=STREAMS)
    assert cfg.kafka.topics.events == "mail.events"
    assert cfg.kafka.qualify("mailtap-imap") == "mailtap-imap"
    assert cfg.section("smtp", SmtpSinkSettings).group_id == "mailtap-smtp-sink"
    assert cfg.section("streams", StreamsSettings).app_id == "mailtap-streams"


def test_sections_derive_their_group_ids_app_id_and_state_topic() -> None:
    cfg = config({"namespace": "stage"}, smtp=SMTP, streams=STREAMS)
    sink = cfg.section("smtp", SmtpSinkSettings)
    assert (sink.group_id, sink.bounce_group_id, sink.state_topic) == (
        "stage.mailtap-smtp-sink",
        "stage.mailtap-bounce-reader",
        "stage.mailtap.sink.state",
    )
    assert cfg.section("streams", StreamsSettings).app_id == "stage.mailtap-streams"


def test_an_explicit_group_id_wins_in_a_section() -> None:
    cfg = config({"namespace": "stage"}, smtp={**SMTP, "group_id": "relay-team"})
    assert cfg.section("smtp", SmtpSinkSettings).group_id == "relay-team"


def test_transactional_ids_of_two_namespaces_differ_for_the_same_mailbox() -> None:
    location = SourceLocation("imap", "support", "INBOX")
    ids = {
        location.transactional_id(config({"namespace": n}).kafka.qualify("mailtap-imap"))
        for n in ("prod", "stage")
    }
    assert {i.split("-")[0] for i in ids} == {"prod.mailtap", "stage.mailtap"}


def test_a_source_group_work_topic_is_inside_the_namespace() -> None:
    from connectors.imap.config import ImapSourceSettings

    imap = {
        "accounts": [
            {"name": "a", "host": "h", "username": "u", "password": "p", "security": "plain"}
        ],
        "group": {"id": "imap-team"},
    }
    settings = config({"namespace": "prod"}, imap=imap).section("imap", ImapSourceSettings)
    assert settings.group is not None
    assert settings.group.id == "imap-team"
    assert settings.group.topic("imap") == "prod.mailtap.imap-work"


@pytest.mark.parametrize("bad", ["", "prod.eu", "-x", "a" * 41, "prod/x"])
def test_a_namespace_that_cannot_start_a_topic_name_is_refused(bad: str) -> None:
    with pytest.raises(ValidationError, match=r"kafka\.namespace"):
        config({"namespace": bad})


def test_a_source_group_without_an_id_joins_mailtap_source_inside_the_namespace() -> None:
    # Two deployments with `group: {}` must never divide each other's mailboxes.
    from connectors.imap.config import ImapSourceSettings

    imap = {
        "accounts": [
            {"name": "a", "host": "h", "username": "u", "password": "p", "security": "plain"}
        ],
        "group": {},
    }
    for namespace, expected in ((None, "mailtap-imap"), ("stage", "stage.mailtap-imap")):
        kafka = {"namespace": namespace} if namespace else {}
        settings = config(kafka, imap=imap).section("imap", ImapSourceSettings)
        assert settings.group is not None and settings.group.id == expected
