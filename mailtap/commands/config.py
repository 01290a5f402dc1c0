"""``mailtap config check|reference``: validate a file; print every key with its type and default.

``config check`` checks a file *for the components that run from it*: each component needs the
core sections and its own (``mailtap run streams`` stops at start without ``streams:``), so a
file is valid only when every section each of its components needs is present and valid. The
components are the ``--component`` options, else the file's ``components:`` list, else those
whose section the file has.

``docs/configuration.md`` is the output of ``mailtap config reference``; a unit test keeps the two
equal, so the documentation cannot drift from the settings models.
"""

from __future__ import annotations

import types
import typing
from typing import Any

import click
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from connectors.core.config import (
    ClaimCheckSettings,
    HealthSettings,
    KafkaSettings,
    MailtapConfig,
    load_config,
)
from connectors.core.errors import ConfigError
from mailtap.cli import import_optional
from mailtap.commands.common import config_option

#: section -> (model path, what it configures). Core sections first.
SECTIONS: dict[str, tuple[str, str]] = {
    "kafka": (
        "connectors.core.config:KafkaSettings",
        "the Kafka cluster, topics and Schema Registry",
    ),
    "claim_check": (
        "connectors.core.config:ClaimCheckSettings",
        "where large bodies and raw MIME go",
    ),
    "health": ("connectors.core.config:HealthSettings", "/metrics and /healthz"),
    "imap": (
        "connectors.imap.config:ImapSourceSettings",
        "the IMAP source (`mailtap run imap-source`)",
    ),
    "ews": (
        "connectors.ews.config:EwsSourceSettings",
        "the Exchange source (`mailtap run ews-source`)",
    ),
    "graph": (
        "connectors.graph.config:GraphSourceSettings",
        "the Microsoft Graph source (`mailtap run graph-source`)",
    ),
    "streams": ("streams.config:StreamsSettings", "the streams worker (`mailtap run streams`)"),
    "smtp": ("connectors.smtp.config:SmtpSinkSettings", "the SMTP sink (`mailtap run smtp-sink`)"),
    "console": (
        "mailtap.console.settings:ConsoleSettings",
        "the operator console (`mailtap run console`)",
    ),
}
CORE = {"kafka": KafkaSettings, "claim_check": ClaimCheckSettings, "health": HealthSettings}

#: component (``mailtap run NAME``) -> its own section; each also needs the core sections.
COMPONENT_SECTIONS: dict[str, str] = {
    "imap-source": "imap",
    "ews-source": "ews",
    "graph-source": "graph",
    "streams": "streams",
    "smtp-sink": "smtp",
    "console": "console",
}
#: Optional top-level key listing the components a file is meant for (not a section).
COMPONENTS_KEY = "components"


def section_model(name: str) -> type[BaseModel]:
    module_name, attr = SECTIONS[name][0].split(":")
    model: type[BaseModel] = getattr(import_optional(module_name), attr)
    return model


@click.group()
def config() -> None:
    """Check a configuration file; print the reference of every key."""


@config.command("check")
@config_option
@click.option(
    "--component",
    "components",
    multiple=True,
    type=click.Choice(sorted(COMPONENT_SECTIONS)),
    help="Check for this component (repeatable). Default: the file's 'components:' list, "
    "else every component whose section the file has.",
)
def check(config_path: str, components: tuple[str, ...]) -> None:
    """Check that every section each component of the file needs is present and valid.

    With --component, only what those components read at start (the core sections and their
    own); without, also every other section present.
    """
    try:
        cfg = load_config(config_path)
        wanted = list(components) or components_of(cfg)
        checked = [*CORE, *(COMPONENT_SECTIONS[name] for name in wanted)]
        missing = [
            f"'{COMPONENT_SECTIONS[name]}' (for {name})"
            for name in wanted
            if not cfg.has_section(COMPONENT_SECTIONS[name])
        ]
        if missing:
            raise ConfigError(
                f"{config_path}: section {', '.join(missing)} is missing; the component stops at "
                f"start without it: add the section (docs/configuration.md lists its keys)"
            )
        for name in SECTIONS:
            # --component: what those components read at start (another component's section
            # may lack its credentials in their environment); else every section present.
            present = cfg.has_section(name) and not components
            if name not in CORE and (name in checked or present):
                settings = cfg.section(name, section_model(name))
                if name == "streams":
                    _check_workflows(settings)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    unknown = sorted(set(cfg.model_extra or {}) - set(SECTIONS) - {COMPONENTS_KEY})
    if unknown:
        raise click.ClickException(
            f"{config_path}: unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}"
        )
    if not wanted:
        raise click.ClickException(
            f"{config_path}: no component runs from this file: add a section "
            f"({', '.join(COMPONENT_SECTIONS.values())}), a 'components:' list or --component"
        )
    click.echo(
        f"{config_path}: valid for {', '.join(wanted)} ({', '.join(dict.fromkeys(checked))})"
    )


def components_of(cfg: MailtapConfig) -> list[str]:
    """The components a file is meant for: its ``components:`` list, else inferred from sections."""
    declared = (cfg.model_extra or {}).get(COMPONENTS_KEY)
    if declared is None:
        return [name for name, section in COMPONENT_SECTIONS.items() if cfg.has_section(section)]
    names = [declared] if isinstance(declared, str) else declared
    if not isinstance(names, list) or not names:
        raise ConfigError(
            f"{cfg.source_path}: components: expected a list of {', '.join(COMPONENT_SECTIONS)}"
        )
    wrong = [str(n) for n in names if n not in COMPONENT_SECTIONS]
    if wrong:
        raise ConfigError(
            f"{cfg.source_path}: components: unknown {', '.join(wrong)}; "
            f"known: {', '.join(COMPONENT_SECTIONS)}"
        )
    return [str(n) for n in names]


def _check_workflows(settings: Any) -> None:
    # The worker binds its workflows at start (a rule naming an unknown workflow stops it):
    # check that here too, so a file that passes also starts.
    bind_workflows = import_optional("streams.workflow").bind_workflows
    bind_workflows(settings)


@config.command("reference")
def reference() -> None:
    """Print the Markdown reference of every configuration key (docs/configuration.md)."""
    click.echo(render_reference(), nl=False)


def render_reference() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated by `mailtap config reference`; do not edit by hand. One YAML file per",
        "deployment; any key can be overridden with `MAILTAP__<SECTION>__<KEY>` (nested keys joined",
        "by `__`, a list entry by its index: `MAILTAP__IMAP__ACCOUNTS__0__PASSWORD`), and",
        "`MAILTAP_KAFKA_BOOTSTRAP` overrides `kafka.bootstrap_servers` (its alias",
        "`MAILTAP__KAFKA__BOOTSTRAP_SERVERS` must agree with it when both are set). A variable's",
        "value takes the type of its key: a `str` or `SecretStr` key gets the text exactly as",
        "written (`#`, `!`, `:`, quotes, leading zeros and spaces included), a number or bool is",
        "parsed, a list or mapping is read as YAML (`[INBOX, Archive]`), and `null` (or `~`)",
        "unsets an optional key.",
        "Secrets from files: with `MAILTAP_SECRETS_DIR=DIR` (compose secrets, a Kubernetes Secret",
        "volume) every file of DIR named like a variable (`DIR/MAILTAP__KAFKA__SASL_PASSWORD`)",
        "sets that key as the variable would, its content the value (one final line ending",
        "dropped); other files are ignored, and a key set both by a file and by a variable is an",
        "error.",
        "`mailtap config check -c FILE [--component NAME]` checks that every section each",
        "component run from the file needs is present and valid; the components are the file's",
        "optional top-level `components:` list (imap-source, ews-source, streams, smtp-sink), else",
        "those whose section it has. Unknown keys are errors.",
        "",
    ]
    for name, (_, what) in SECTIONS.items():
        lines += [
            f"## `{name}`: {what}",
            "",
            "| key | type | default | description |",
            "|---|---|---|---|",
        ]
        lines += _rows(section_model(name), name)
        lines.append("")
    return "\n".join(lines)


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows: list[str] = []
    for key, field in model.model_fields.items():
        path = f"{prefix}.{field.alias or key}"
        nested = _nested_model(field.annotation)
        if nested is not None:
            origin = typing.get_origin(field.annotation)
            suffix = "[]" if origin in (list, tuple) else ".<name>" if origin is dict else ""
            rows.append(
                f"| `{path}` | {_type_name(field.annotation)} | {_default(field)} | {_describe(field)} |"
            )
            rows += _rows(nested, f"{path}{suffix}")
            continue
        rows.append(
            f"| `{path}` | {_type_name(field.annotation)} | {_default(field)} | {_describe(field)} |"
        )
    return rows


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    args = typing.get_args(annotation)
    models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
    if (
        typing.get_origin(annotation) in (list, tuple, dict, typing.Union, types.UnionType)
        and len(models) == 1
    ):
        return models[0]
    return None


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if typing.get_origin(annotation) is None else None
    text = text or str(annotation)
    for noise in ("typing.", "pydantic.types.", "re.", "datetime.", "<class '", "'>"):
        text = text.replace(noise, "")
    text = text.replace("|", "\\|")
    for module in ("connectors.", "streams."):
        while module in text:
            start = text.index(module)
            end = start
            while end < len(text) and (text[end].isalnum() or text[end] in "._"):
                end += 1
            text = text[:start] + text[start:end].rsplit(".", 1)[-1] + text[end:]
    return text


def _default(field: FieldInfo) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "**required**"
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if isinstance(value, BaseModel):
        return "(section)"
    if value is None or value == [] or value == {}:
        return "`" + repr(value) + "`" if value is not None else ""
    if hasattr(value, "get_secret_value"):
        return "(secret)"
    shown = getattr(value, "pattern", value)
    return f"`{shown}`".replace("|", "\\|")


def _describe(field: FieldInfo) -> str:
    return (field.description or "").replace("|", "\\|").replace("\n", " ")
