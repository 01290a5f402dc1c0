"""``mailtap demo [--follow]``: the README's main job."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.option(
    "--follow", is_flag=True, help="Keep the pipeline running after the summary (Ctrl-C stops)."
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Local services' state folder (default .state/dev).",
)
@click.option(
    "--timeout", type=float, default=90.0, show_default=True, help="Seconds to wait per stage."
)
def demo(follow: bool, state_dir: Path | None, timeout: float) -> None:
    """Run the whole pipeline on sample mail against the local services."""
    from mailtap.demo.run import run_demo

    result = run_demo(state_dir, follow, timeout)
    if not result.ok:
        raise SystemExit(1)
