"""Options and helpers shared by the subcommands."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from connectors.core.config import MailtapConfig
from connectors.core.kafka.clients import request_stop
from connectors.core.kafka.topics import DEFAULT_RETRY_TIERS

if TYPE_CHECKING:
    from connectors.smtp.config import SmtpSinkSettings

F = TypeVar("F", bound=Callable[..., Any])

CONFIG_ENV = "MAILTAP_CONFIG"


def _config_given(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    if not value:
        # Without this, the missing path surfaced later as "TypeError: expected str ... not NoneType".
        raise click.UsageError(
            f"no configuration file: pass -c PATH or set {CONFIG_ENV}=PATH "
            f"(`mailtap dev up` writes one for the local services; `mailtap config reference` "
            f"lists every key)",
            ctx,
        )
    return value


def config_option(func: F) -> F:
    """``-c/--config PATH``, defaulting to ``$MAILTAP_CONFIG``."""
    option = click.option(
        "-c",
        "--config",
        "config_path",
        default=lambda: os.environ.get(CONFIG_ENV),
        callback=_config_given,
        type=click.Path(dir_okay=False),
        help=f"mailtap YAML config (default: ${CONFIG_ENV}).",
    )
    return option(func)


def sink_settings(cfg: MailtapConfig) -> SmtpSinkSettings | None:
    """The validated ``smtp`` section, None when the configuration runs no sink."""
    # Imported here: every command imports this module, the IMAP source included (issue 29).
    from connectors.smtp.config import SmtpSinkSettings

    return cfg.section("smtp", SmtpSinkSettings) if cfg.has_section("smtp") else None


def retry_tiers_of(cfg: MailtapConfig) -> tuple[str, ...]:
    """The SMTP sink's retry tiers (the topics depend on them): its settings', defaulted there."""
    sink = sink_settings(cfg)
    return tuple(sink.retry_tiers) if sink is not None else DEFAULT_RETRY_TIERS


def install_stop_signals(stop: Callable[[], None]) -> None:
    """SIGTERM and SIGINT call ``stop()`` and end any wait for Kafka (init_transactions, a
    cursor read): the sources' ``run_forever`` hands this its stop."""

    def _stop(_signum: int, _frame: object) -> None:
        request_stop()
        stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
