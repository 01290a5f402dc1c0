"""``mailtap status`` asks for the lag of the groups the config runs, on their own topics only."""

from __future__ import annotations

import pytest

from connectors.core.config import config_from_dict
from connectors.core.errors import ConfigError
from mailtap.commands.status import lag_groups

KAFKA = {"bootstrap_servers": "127.0.0.1:9092"}
SMTP = {"host": "relay", "from_address": "noreply@example.com"}


def test_groups_and_topics_of_streams_and_sink() -> None:
    cfg = config_from_dict(
        {
            "kafka": KAFKA,
            "streams": {"app_id": "helpdesk", "from_address": {"address": "helpdesk@example.com"}},
            "smtp": {**SMTP, "group_id": "sink-a", "retry_tiers": ["1m", "1h"]},
        }
    )
    assert lag_groups(cfg) == {
        "helpdesk": ["mail.events"],
        "sink-a": ["mail.commands", "mail.commands.retry.1m", "mail.commands.retry.1h"],
    }


def test_default_tiers_and_nothing_for_a_source_only_config() -> None:
    sink = config_from_dict({"kafka": KAFKA, "smtp": SMTP})
    assert lag_groups(sink)["mailtap-smtp-sink"][1:] == [
        f"mail.commands.retry.{t}" for t in ("5m", "15m", "1h", "4h")
    ]
    assert lag_groups(config_from_dict({"kafka": KAFKA})) == {}


def test_an_invalid_smtp_section_is_reported_not_read_past() -> None:
    cfg = config_from_dict({"kafka": KAFKA, "smtp": {**SMTP, "retry_tiers": []}})
    with pytest.raises(ConfigError, match=r"smtp\.retry_tiers"):
        lag_groups(cfg)
