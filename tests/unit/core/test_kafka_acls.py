"""connectors.core.kafka.acls: the ACLs per component, the names it shares with the components'
code, and deploy/README.md's ACL table (generated from it, checked here)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from connectors.core.config import MailtapConfig, config_from_dict, load_config
from connectors.core.errors import ConfigError
from connectors.core.kafka import acls
from connectors.core.kafka.acls import Acl, markdown_row
from mailtap.acls import component_acls
from mailtap.commands.acls import acls as acls_command

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "deploy" / "README.md"
#: The compose configs' secrets and sender addresses come from the environment (its env file,
#: deploy/compose/mailtap.env.example); any value does for the names.
ENV = {
    "MAILTAP__IMAP__ACCOUNTS__0__PASSWORD": "x",
    "MAILTAP__EWS__ACCOUNTS__0__PASSWORD": "x",
    "MAILTAP__SMTP__FROM_ADDRESS": "support@example.com",
    "MAILTAP__STREAMS__FROM_ADDRESS__ADDRESS": "support@example.com",
}


#: The components with a config file of their own; the others read compose's mailtap.yaml.
OWN_FILES = {"ews-source": "ews-source.yaml", "graph-source": "graph-source.yaml"}
#: The Graph source ships as a Kubernetes component only: its config is that ConfigMap's.
GRAPH_CONFIGMAP = ROOT / "deploy" / "k8s" / "components" / "graph-source" / "config.yaml"


def compose_config(name: str) -> MailtapConfig:
    if name == "graph-source.yaml":
        text = yaml.safe_load(GRAPH_CONFIGMAP.read_text())["data"]["mailtap.yaml"]
        # Its secrets come from the Deployment's variables (Secrets), as in the pod.
        env = {
            "MAILTAP__GRAPH__CLIENT_SECRET": "x",
            "MAILTAP__KAFKA__SASL_USERNAME": "mailtap-graph-source",
            "MAILTAP__KAFKA__SASL_PASSWORD": "x",
        }
        return config_from_dict(yaml.safe_load(text), env=env)
    # The sources' files have no smtp or streams section: their env has no senders to give.
    env = ENV if name == "mailtap.yaml" else {k: v for k, v in ENV.items() if "FROM_" not in k}
    return load_config(ROOT / "deploy" / "compose" / name, env=env)


def readme_rows() -> list[str]:
    """The table of deploy/README.md, regenerated: one row per component."""
    rows = []
    for component in acls.COMPONENTS:
        cfg = compose_config(OWN_FILES.get(component, "mailtap.yaml"))
        rows.append(markdown_row(f"mailtap-{component}", component_acls(cfg, component)))
    return rows


def test_readme_table_is_the_computed_one() -> None:
    text = README.read_text()
    block = re.search(r"<!-- acls:begin -->\n(.*?)<!-- acls:end -->", text, re.S)
    assert block, "deploy/README.md lost its <!-- acls:begin/end --> markers"
    header = (
        "| principal | topics (operations) | groups (operations) | transactional ids |\n"
        "|---|---|---|---|\n"
    )
    expected = header + "\n".join(readme_rows()) + "\n"
    assert block.group(1) == expected, "regenerate the table:\n" + expected


def test_fixed_names_match_the_components_code() -> None:
    from connectors.core.kafka import encoding
    from connectors.ews import source as ews_source
    from connectors.graph import source as graph_source
    from connectors.imap import source as imap_source

    assert acls.IMAP_TRANSACTIONAL_PREFIX == imap_source.TRANSACTIONAL_PREFIX + "-"
    assert acls.EWS_TRANSACTIONAL_PREFIX == ews_source.TRANSACTIONAL_ID_PREFIX + "-"
    assert acls.GRAPH_TRANSACTIONAL_PREFIX == graph_source.TRANSACTIONAL_ID_PREFIX + "-"
    sources = {
        acls.IMAP_INDEX_GROUP: ROOT / "connectors/imap/indexlog.py",
        acls.OFFSETS_GROUP: ROOT / "connectors/core/kafka/offsets.py",
        acls.MAILBOXES_GROUP: ROOT / "connectors/core/source/ownership/catalog.py",
        acls.SUPPRESSIONS_GROUP_PREFIX: ROOT / "connectors/smtp/suppression.py",
        acls.CONSUME_GROUP_PREFIX: ROOT / "mailtap/commands/consume.py",
        acls.SCAN_GROUP_PREFIX: ROOT / "mailtap/commands/topicscan.py",
        acls.LAG_GROUP_PREFIX: ROOT / "mailtap/commands/topicscan.py",
        acls.TRACE_GROUP_PREFIX: ROOT / "mailtap/trace.py",
    }
    for name, path in sources.items():
        assert name in path.read_text(), f"{path} no longer uses the group {name}"
    assert acls.ENCODING_CHECK_GROUP_PREFIX in Path(encoding.__file__).read_text()


def test_graph_source_gets_its_transactions_dlq_and_group() -> None:
    graph = component_acls(compose_config("graph-source.yaml"), "graph-source")
    assert Acl("transactional-id", "mailtap-graph-", "Write", "prefixed") in graph
    assert Acl("topic", "mail.events", "Write") in graph
    assert Acl("topic", "mail.commands.dlq", "Write") in graph
    assert Acl("group", "mailtap-graph", "Read") in graph
    assert Acl("topic", "mailtap.graph-work", "Read") in graph  # the group's work topic
    assert not [a for a in graph if "imap" in a.name or "ews" in a.name]


def test_sink_needs_nothing_of_the_sources_topics() -> None:
    cfg = compose_config("mailtap.yaml")
    sink = component_acls(cfg, "smtp-sink")
    topics = {a.name for a in sink if a.resource_type == "topic"}
    assert "mail.events" not in topics and "mail.workflow" not in topics
    assert Acl("topic", "mail.suppressions", "Read") in sink
    assert Acl("topic", "mail.delivery", "Write") in sink
    assert Acl("transactional-id", "mailtap-smtp-sink.", "Write", "prefixed") in sink


def test_bounce_accounts_and_suppression_off_change_the_sink_set() -> None:
    cfg = compose_config("mailtap.yaml")
    raw = cfg.model_dump()
    raw["smtp"] = {**raw["smtp"], "bounce_accounts": ["bounces"]}
    bounce = component_acls(MailtapConfig.model_validate(raw), "smtp-sink")
    assert Acl("topic", "mail.events", "Read") in bounce
    assert Acl("group", "mailtap-bounce-reader", "Read") in bounce
    assert Acl("transactional-id", "mailtap-bounce-reader.", "Write", "prefixed") in bounce
    assert Acl("topic", "mail.suppressions", "Write") in bounce
    raw["smtp"] = {**raw["smtp"], "bounce_accounts": [], "suppression": {"enabled": False}}
    quiet = component_acls(MailtapConfig.model_validate(raw), "smtp-sink")
    assert not [a for a in quiet if a.name == "mail.suppressions"]


def test_topic_names_and_tiers_come_from_the_config() -> None:
    cfg = compose_config("mailtap.yaml")
    raw = cfg.model_dump()
    raw["kafka"]["topics"] = {"commands": "prod.commands", "retry_prefix": "prod.retry"}
    raw["smtp"] = {**raw["smtp"], "retry_tiers": ["1m"]}
    sink = component_acls(MailtapConfig.model_validate(raw), "smtp-sink")
    names = {a.name for a in sink if a.resource_type == "topic"}
    assert {"prod.commands", "prod.retry.1m"} <= names
    assert "mail.commands" not in names and "prod.retry.5m" not in names


def test_imap_source_with_a_group_gets_its_work_topic_and_group() -> None:
    cfg = compose_config("mailtap.yaml")
    raw = cfg.model_dump(exclude_none=True)
    raw["imap"] = {**raw["imap"], "group": {"id": "imap-prod", "work_topic": "prod.work"}}
    grouped = component_acls(MailtapConfig.model_validate(raw), "imap-source")
    assert Acl("group", "imap-prod", "Read") in grouped
    assert Acl("topic", "prod.work", "Read") in grouped
    del raw["imap"]["group"]
    alone = component_acls(MailtapConfig.model_validate(raw), "imap-source")
    assert not [a for a in alone if a.name in ("imap-prod", "prod.work")]


def test_missing_section_is_a_config_error() -> None:
    cfg = compose_config("ews-source.yaml")
    with pytest.raises(ConfigError, match="no smtp section"):
        component_acls(cfg, "smtp-sink")


def test_cli_prints_kafka_acls_lines_and_json(tmp_path: Path) -> None:
    path = tmp_path / "sink.yaml"
    path.write_text((ROOT / "deploy/compose/mailtap.yaml").read_text())
    runner = CliRunner(env=ENV)
    lines = runner.invoke(
        acls_command, ["-c", str(path), "--component", "reader", "--bootstrap-server", "k:9"]
    )
    assert lines.exit_code == 0, lines.output
    assert lines.output.splitlines() == [
        "kafka-acls.sh --bootstrap-server k:9 --add --allow-principal User:mailtap-reader "
        "--operation Read --resource-pattern-type prefixed --group mailtap-consume-",
        "kafka-acls.sh --bootstrap-server k:9 --add --allow-principal User:mailtap-reader "
        "--operation Read --topic mail.events",
    ]
    out = runner.invoke(
        acls_command, ["-c", str(path), "--component", "smtp-sink", "--format", "json"]
    )
    assert out.exit_code == 0, out.output
    parsed = json.loads(out.output)
    assert parsed["principal"] == "User:mailtap-smtp-sink"
    assert {
        "resource_type": "topic",
        "name": "mail.delivery",
        "pattern": "literal",
        "operation": "Write",
        "reason": "the delivery events",
    } in parsed["acls"]


def test_implied_operations_are_left_out() -> None:
    """Read/Write imply Describe, AlterConfigs implies DescribeConfigs (Kafka's authorizer)."""
    for component in acls.COMPONENTS:
        needed = component_acls(compose_config(OWN_FILES.get(component, "mailtap.yaml")), component)
        held = {(a.resource_type, a.name, a.pattern, a.operation) for a in needed}
        for a in needed:
            key = (a.resource_type, a.name, a.pattern)
            if a.operation == "Describe":
                assert not {(*key, "Read"), (*key, "Write")} & held, (component, a)
            if a.operation == "DescribeConfigs":
                assert (*key, "AlterConfigs") not in held, (component, a)


def test_a_refused_streams_topic_names_the_prefixed_acl_to_grant() -> None:
    """ensure_topic_specs names the literal changelog topic it may not create; the operator
    grants the prefixed ACL of `mailtap acls`, so that is what the sentence names."""
    from connectors.core.config import KafkaSettings
    from connectors.core.kafka.permissions import permission_denied, under_prefix

    kafka = KafkaSettings(
        bootstrap_servers="k:9092", sasl_username="mailtap-streams", sasl_password="x"
    )
    needed = acls.streams_acls(kafka, "mailtap-streams")
    literal = Acl("topic", "mailtap-streams-runs-changelog", "Create")
    sentence = str(under_prefix(kafka, permission_denied(kafka, literal), needed))
    assert sentence.startswith(
        "kafka: principal User:mailtap-streams may not CREATE topic mailtap-streams-* (prefixed) "
        "(TOPIC_AUTHORIZATION_FAILED): grant it with: kafka-acls.sh"
    ), sentence
    assert "--resource-pattern-type prefixed --topic mailtap-streams-" in sentence
    # A topic outside the prefix keeps its own literal ACL.
    other = Acl("topic", "mail.commands", "Create")
    assert "topic mail.commands (TOPIC" in str(
        under_prefix(kafka, permission_denied(kafka, other), needed)
    )


def test_the_dev_config_without_an_ews_section_gets_the_ews_acls_of_no_group() -> None:
    cfg = MailtapConfig.model_validate({"kafka": {"bootstrap_servers": "k:9092"}})
    names = {(a.resource_type, a.name) for a in component_acls(cfg, "ews-source")}
    assert ("transactional-id", "mailtap-ews-") in names
    assert not any(name.endswith("-work") for _, name in names)


def test_a_namespace_puts_every_name_inside_it() -> None:
    """kafka.namespace (issue 27 item 5): every topic, group and transactional-id prefix the
    ACLs name starts with '<namespace>.', so one deployment's ACLs can be prefixed ACLs."""
    cfg = MailtapConfig.model_validate(
        {
            "kafka": {"bootstrap_servers": "k:9092", "namespace": "prod"},
            "smtp": {"host": "relay", "from_address": "a@example.com"},
            "streams": {"from_address": {"address": "a@example.com"}},
        }
    )
    for component in ("imap-source", "ews-source", "streams", "smtp-sink", "console", "reader"):
        names = {a.name for a in component_acls(cfg, component)}
        assert names and all(n.startswith("prod.") for n in names), (component, names)


def test_console_reads_what_it_shows_and_writes_only_its_actions() -> None:
    console = component_acls(compose_config("mailtap.yaml"), "console")
    written = {a.name for a in console if a.operation == "Write"}
    # Its actions: replay, drop notes, reset_state, mailboxes, rewind, suppressions, audit.
    assert written == {
        "mail.commands",
        "mail.commands.dlq.dropped",
        "mailtap.sink.state",
        "mailtap.mailboxes",
        "mailtap.offsets",
        "mail.suppressions",
        "mailtap.audit",
    }
    read = {a.name for a in console if a.operation == "Read" and a.resource_type == "topic"}
    assert {"mail.events", "mail.delivery", "mail.workflow", "mail.commands.dlq"} <= read
    # The groups it reports: Describe only (committed offsets, members), never Read: it
    # must not be able to join and steal the sink's or the streams worker's partitions.
    for group in ("mailtap-smtp-sink", "mailtap-streams", "mailtap-imap"):
        assert Acl("group", group, "Describe") in console
        assert Acl("group", group, "Read") not in console
    assert Acl("topic", "mailtap.imap-work", "Describe") in console  # the owners' partitions
    assert not [a for a in console if a.resource_type == "transactional-id"]


def test_console_without_streams_and_sink_reports_no_lag_groups() -> None:
    cfg = MailtapConfig.model_validate({"kafka": {"bootstrap_servers": "k:9092"}})
    groups = {a.name for a in component_acls(cfg, "console") if a.resource_type == "group"}
    assert groups == {"mailtap-scan-", "mailtap-trace-", "mailtap-lag-", "mailtap-mailboxes-reader"}
