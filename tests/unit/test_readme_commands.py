"""README.md's command table names every ``mailtap`` command and subcommand, and nothing else:
the table is read both ways against click's command tree (the same tree ``mailtap --help``
and every group's ``--help`` print)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from mailtap.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


#: Commands whose choice argument names what they are (a component): one row per choice.
BY_CHOICE = {("run",)}


def command_paths(command: click.Command, path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every leaf command as its words; ``run`` counts once per component."""
    ctx = click.Context(command)
    if isinstance(command, click.Group):
        paths: set[tuple[str, ...]] = set()
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None, name
            if not sub.hidden:
                paths |= command_paths(sub, (*path, name))
        return paths
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    if path in BY_CHOICE and isinstance(arguments[0].type, click.Choice):
        return {(*path, str(choice)) for choice in arguments[0].type.choices}
    return {path}


def table_rows() -> list[str]:
    text = README.read_text()
    section = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `mailtap ")]


def documented_paths() -> set[tuple[str, ...]]:
    """The commands the first cell of each row names: ``mailtap dlq list\\|show -c CONFIG``
    is ``dlq list`` and ``dlq show``."""
    paths: set[tuple[str, ...]] = set()
    for row in table_rows():
        cell = row.split(" | ", 1)[0]
        for usage in re.findall(r"`(mailtap [^`]+)`", cell):
            paths |= _usage_paths(usage.replace("\\|", "|").split()[1:])
    return paths


def _usage_paths(words: list[str]) -> set[tuple[str, ...]]:
    """``["dlq", "list|show", "-c", "CONFIG"]`` -> ``{("dlq", "list"), ("dlq", "show")}``."""
    command: click.Command = main
    path: list[str] = []
    for word in words:
        if word.startswith(("-", "[")) or word.isupper():
            break  # options and metavariables: the command is complete
        names = word.split("|")
        sub = (
            command.get_command(click.Context(command), names[0])
            if isinstance(command, click.Group)
            else None
        )
        if len(names) > 1 or sub is None:
            # alternatives, a leaf's choice argument (run imap-source) or an unknown word
            return {(*path, name) for name in names}
        command = sub
        path.append(word)
    return {tuple(path)}


def test_every_command_is_in_the_readme_table() -> None:
    missing = command_paths(main) - documented_paths()
    assert not missing, f"README.md's command table lacks: {sorted(' '.join(p) for p in missing)}"


def test_the_readme_table_names_only_commands_that_exist() -> None:
    unknown = documented_paths() - command_paths(main)
    assert not unknown, f"README.md names commands that do not exist: {sorted(unknown)}"


def test_the_table_is_found_and_parsed() -> None:
    # A README reshaped so that no row is found must not pass both tests above by accident.
    assert len(table_rows()) >= 10
    assert ("config", "check") in documented_paths()
    assert ("run", "streams") in documented_paths()
