"""``mailtap consume TOPIC`` inside ``kafka.namespace``: a default topic name means the
deployment's own topic, so one command line (deploy/README.md's walk-through) serves every
deployment; any other name is read as given."""

from __future__ import annotations

from connectors.core.config import KafkaSettings
from mailtap.commands.consume import _in_namespace


def test_a_default_name_is_the_deployments_topic() -> None:
    prod = KafkaSettings(bootstrap_servers="k:9092", namespace="prod")
    assert _in_namespace(prod, "mail.events") == "prod.mail.events"
    assert _in_namespace(prod, "mailtap.offsets") == "prod.mailtap.offsets"


def test_an_explicit_topic_name_wins_and_other_names_are_kept() -> None:
    prod = KafkaSettings.model_validate(
        {"bootstrap_servers": "k:9092", "namespace": "prod", "topics": {"events": "legacy.events"}}
    )
    assert _in_namespace(prod, "mail.events") == "legacy.events"
    assert _in_namespace(prod, "prod.mail.events") == "prod.mail.events"
    assert _in_namespace(prod, "someone.elses.topic") == "someone.elses.topic"


def test_without_a_namespace_every_name_is_kept() -> None:
    plain = KafkaSettings(bootstrap_servers="k:9092")
    assert _in_namespace(plain, "mail.events") == "mail.events"
