"""The Kafka names of a configuration's running components that the operator's tools look at:
the consumer groups ``mailtap status`` and the console report the lag of, the sink's state
topic a DLQ replay resets. One place, so that ``mailtap acls --component console`` grants what
these tools then use."""

from __future__ import annotations

from connectors.core.config import MailtapConfig
from connectors.smtp.config import SmtpSinkSettings
from streams.config import StreamsSettings


def _sink(cfg: MailtapConfig) -> SmtpSinkSettings | None:
    return cfg.section("smtp", SmtpSinkSettings) if cfg.has_section("smtp") else None


def lag_groups(cfg: MailtapConfig) -> dict[str, list[str]]:
    """The consumer groups the config runs and the topics each reads (the configured retry tiers
    only: other deployments' retry topics may share the prefix)."""
    topics = cfg.kafka.topics
    groups: dict[str, list[str]] = {}
    if cfg.has_section("streams"):
        groups[cfg.section("streams", StreamsSettings).app_id] = [topics.events]
    sink = _sink(cfg)
    if sink is not None:
        retries = [f"{topics.retry_prefix}.{t}" for t in sink.retry_tiers]
        groups[sink.group_id] = [topics.commands, *retries]
    return groups


def sink_state_topic(cfg: MailtapConfig) -> str:
    """The SMTP sink's state topic: the config's, else the default."""
    sink = _sink(cfg)
    if sink is not None:
        return sink.state_topic
    default: str = SmtpSinkSettings.model_fields["state_topic"].default
    return default
