"""``mailtap status`` asks for the lag of the groups the config runs, on their own topics only."""

from __future__ import annotations

from connectors.core.config import config_from_dict
from mailtap.commands.status import lag_groups

KAFKA = {"bootstrap_servers": "127.0.0.1:9092"}


def test_groups_and_topics_of_streams_and_sink() -> None:
    cfg = config_from_dict(
        {
            "kafka": KAFKA,
            "streams": {"app_id": "helpdesk"},
            "smtp": {"host": "relay", "group_id": "sink-a", "retry_tiers": ["1m", "1h"]},
        }
    )
    assert lag_groups(cfg) == {
        "helpdesk": ["mail.events"],
        "sink-a": ["mail.commands", "mail.commands.retry.1m", "mail.commands.retry.1h"],
    }


def test_default_tiers_and_nothing_for_a_source_only_config() -> None:
    sink = config_from_dict({"kafka": KAFKA, "smtp": {"host": "relay"}})
    assert lag_groups(sink)["mailtap-smtp-sink"][1:] == [
        f"mail.commands.retry.{t}" for t in ("5m", "15m", "1h", "4h")
    ]
    assert lag_groups(config_from_dict({"kafka": KAFKA})) == {}
