"""Options and helpers shared by the subcommands."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from connectors.core.config import MailtapConfig

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


def retry_tiers_of(cfg: MailtapConfig) -> tuple[str, ...]:
    """The SMTP sink's retry tiers when configured (the topics depend on them)."""
    if not cfg.has_section("smtp"):
        return ()
    raw = (cfg.model_extra or {}).get("smtp") or {}
    tiers = raw.get("retry_tiers") if isinstance(raw, dict) else None
    return tuple(str(t) for t in tiers) if tiers else ()
