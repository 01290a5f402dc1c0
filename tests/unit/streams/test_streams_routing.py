"""Routing rules and the settings that carry them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from connectors.core.config import config_from_dict
from connectors.core.errors import ConfigError
from streams.config import RoutingRule, StreamsSettings
from streams.mail import MailView
from streams.routing import route
from streams.testing import mail_record
from streams.workflow import bind_workflows


def rules(*raw: dict[str, Any]) -> list[RoutingRule]:
    return [RoutingRule.model_validate(r) for r in raw]


def mail(**kwargs: Any) -> MailView:
    return MailView.from_record(mail_record(**kwargs))


def test_first_matching_rule_wins() -> None:
    table = rules(
        {"name": "exp", "match": {"has_attachment": True}, "workflow": "approval"},
        {"match": {}, "workflow": "ticket_intake"},
    )
    attachment = {"filename": "r.pdf", "content_type": "application/pdf", "size": 1, "sha256": "0"}
    assert route(mail(attachments=[attachment]), table).name == "exp"  # type: ignore[union-attr]
    assert route(mail(), table).workflow == "ticket_intake"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("condition", "matching", "other"),
    [
        ({"account": "demo"}, {"account": "demo"}, {"account": "sales"}),
        ({"folder": "Approvals"}, {"folder": "Approvals"}, {"folder": "INBOX"}),
        ({"recipient": "*@support.example.com"}, {"to": ["A@Support.Example.com"]}, {}),
        ({"sender": "*@partner.example"}, {"sender": "bob@partner.example"}, {}),
        ({"subject": "(?i)expense"}, {"subject": "Travel EXPENSE March"}, {}),
        (
            {"has_attachment": False},
            {},
            {"attachments": [{"content_type": "a/b", "size": 1, "sha256": "0"}]},
        ),
    ],
)
def test_each_condition_matches_and_rejects(
    condition: dict[str, Any], matching: dict[str, Any], other: dict[str, Any]
) -> None:
    table = rules({"match": condition, "workflow": "ticket_intake"})
    assert route(mail(**matching), table) is not None
    assert route(mail(**other), table) is None


def test_all_conditions_of_a_rule_must_hold() -> None:
    table = rules(
        {"match": {"recipient": "support@example.com", "subject": "urgent"}, "workflow": "x"}
    )
    assert route(mail(subject="urgent: printer"), table) is not None
    assert route(mail(subject="printer"), table) is None


def test_invalid_subject_pattern_is_a_config_error() -> None:
    with pytest.raises(ValidationError, match="subject"):
        RoutingRule.model_validate({"match": {"subject": "(unclosed"}, "workflow": "x"})


BASE = {"from_address": {"address": "help@example.com"}, "auth_policy": "none"}


def test_section_errors_name_the_key_path() -> None:
    cfg = config_from_dict(
        {
            "kafka": {"bootstrap_servers": "127.0.0.1:9092"},
            "streams": {**BASE, "rules": [{"match": {"colour": "red"}, "workflow": "x"}]},
        }
    )
    with pytest.raises(ConfigError, match=r"streams\.rules\[0\]\.match\.colour"):
        cfg.section("streams", StreamsSettings)


def test_authserv_policy_requires_an_authserv_id() -> None:
    with pytest.raises(ValidationError, match="needs authserv_id"):
        StreamsSettings.model_validate(
            {**BASE, "auth_policy": "authserv", "rules": [{"workflow": "ticket_intake"}]}
        )
    ok = StreamsSettings.model_validate(
        {
            **BASE,
            "rules": [{"workflow": "ticket_intake"}],
            "workflows": {"ticket_intake": {"auth_policy": "dkim"}},
        }
    )
    assert ok.policy_for("ticket_intake") == "dkim-aligned"  # the old name, read as the new one


def test_require_replaces_auth_policy_and_a_wrong_value_is_explained() -> None:
    settings = StreamsSettings.model_validate(
        {
            "from_address": BASE["from_address"],
            "authserv_id": "mx.example.com",
            "workflows": {"ticket_intake": {"require": "dkim-aligned"}, "approval": {}},
        }
    )
    assert settings.policy_for("ticket_intake") == "dkim-aligned"
    # Nothing set: approvals get the strictest policy, other workflows what 0.x did.
    assert settings.policy_for("approval") == "dmarc-pass"
    assert settings.policy_for("other") == "trusted-ar"
    address = {"from_address": BASE["from_address"]}
    with pytest.raises(ValidationError, match="dmarc-pass"):
        StreamsSettings.model_validate({**address, "require": "dmarc"})
    with pytest.raises(ValidationError, match="not both"):
        StreamsSettings.model_validate({**BASE, "require": "none"})  # BASE has auth_policy
    with pytest.raises(ValidationError, match="host:port"):
        StreamsSettings.model_validate({**BASE, "auth": {"nameserver": "127.0.0.1:dns"}})


def test_header_injection_in_from_address_is_refused() -> None:
    with pytest.raises(ValidationError, match="CR or LF"):
        StreamsSettings.model_validate(
            {"from_address": {"address": "help@example.com", "name": "x\r\nBcc: all@x"}}
        )


def test_unknown_workflow_and_bad_options_fail_at_start() -> None:
    unknown = StreamsSettings.model_validate({**BASE, "rules": [{"workflow": "nope"}]})
    with pytest.raises(ConfigError, match="workflow 'nope' is not registered"):
        bind_workflows(unknown)
    bad = StreamsSettings.model_validate(
        {**BASE, "rules": [{"workflow": "approval"}], "workflows": {"approval": {"options": {}}}}
    )
    with pytest.raises(ConfigError, match=r"streams\.workflows\.approval\.options: approver"):
        bind_workflows(bad)


def test_own_addresses_include_every_configured_sender() -> None:
    settings = StreamsSettings.model_validate(
        {
            **BASE,
            "own_addresses": ["Noreply@Example.com"],
            "workflows": {"approval": {"from_address": {"address": "approvals@example.com"}}},
        }
    )
    assert settings.own_address_set == {
        "help@example.com",
        "noreply@example.com",
        "approvals@example.com",
    }
