"""The ACLs of one component for one config: its section read, then
:mod:`connectors.core.kafka.acls` (the core knows no connector's settings class: import rules)."""

from __future__ import annotations

from typing import Any, Literal, cast

from connectors.core.config import MailtapConfig
from connectors.core.errors import ConfigError
from connectors.core.kafka.acls import (
    COMPONENTS,
    Acl,
    admin_acls,
    console_acls,
    reader_acls,
    sink_acls,
    source_acls,
    streams_acls,
)
from connectors.core.kafka.encoding import avro_topics
from connectors.core.kafka.topics import DEFAULT_RETRY_TIERS, topic_specs
from mailtap.deployment_names import lag_groups, sink_state_topic


def component_acls(config: MailtapConfig, component: str) -> list[Acl]:
    """Every ACL ``component`` (one of ``COMPONENTS``) needs with ``config``.

    Raises ConfigError when the config lacks the section of the sink or the streams worker
    (their ACLs follow from it); a source's section is optional (no group without it).
    """
    kafka = config.kafka
    if component in ("imap-source", "ews-source", "graph-source"):
        source = cast(Literal["imap", "ews", "graph"], component.removesuffix("-source"))
        # A source's ACLs depend on its section only through the group (its work topic and
        # group id): a config without the section (the dev stack's, without Exchange) gets
        # those of an instance without a group.
        settings = _section(config, source) if config.has_section(source) else None
        return source_acls(kafka, source=source, group=getattr(settings, "group", None))
    if component == "smtp-sink":
        return sink_acls(kafka, _section(config, "smtp"))
    if component == "streams":
        return streams_acls(kafka, _section(config, "streams").app_id)
    if component == "console":
        return _console_acls(config)
    if component == "admin":
        tiers = (
            _section(config, "smtp").retry_tiers
            if config.has_section("smtp")
            else DEFAULT_RETRY_TIERS
        )
        names = [s.name for s in topic_specs(kafka, tiers)]
        if config.has_section("imap"):
            names.append(kafka.topics.imap_index)
        return admin_acls(kafka, names, avro_topics(kafka, tiers))
    if component == "reader":
        return reader_acls(kafka)
    raise ConfigError(f"unknown component {component!r}: one of {', '.join(COMPONENTS)}")


def _console_acls(config: MailtapConfig) -> list[Acl]:
    """What the console reads and writes follows from the whole file, as its own code reads it:
    the groups ``mailtap status`` reports the lag of, the sources' groups, the sink's state."""
    source_groups = []
    for source in ("imap", "ews", "graph"):
        group = (
            getattr(_section(config, source), "group", None) if config.has_section(source) else None
        )
        if group is not None:
            source_groups.append((group.id, group.topic(source)))
    return console_acls(
        config.kafka,
        lag_groups=lag_groups(config),
        source_groups=source_groups,
        state_topic=sink_state_topic(config),
    )


def _section(config: MailtapConfig, name: str) -> Any:
    # Each settings class is imported only for the component asked about: the connectors'
    # extras need not all be installed.
    if not config.has_section(name):
        raise ConfigError(f"the config has no {name} section: pass the component's own config")
    if name == "imap":
        from connectors.imap.config import ImapSourceSettings

        return config.section(name, ImapSourceSettings)
    if name == "ews":
        from connectors.ews.config import EwsSourceSettings

        return config.section(name, EwsSourceSettings)
    if name == "graph":
        from connectors.graph.config import GraphSourceSettings

        return config.section(name, GraphSourceSettings)
    if name == "smtp":
        from connectors.smtp.config import SmtpSinkSettings

        return config.section(name, SmtpSinkSettings)
    from streams.config import StreamsSettings

    return config.section(name, StreamsSettings)
