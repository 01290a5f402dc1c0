"""A ``kill -9`` of the source at any moment leaves none of its processes behind.

The parse processes and multiprocessing's resource tracker start in the source's first seconds;
a kill while they are still starting is the case that left orphans. Each run marks the source's
environment, which every process it starts inherits, so /proc finds them all after the kill,
also those started in the instant before it.
"""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from pathlib import Path

from tests.integration.imap.imap_harness import ImapHarness, wait_for

MARK = "MAILTAP_TEST_PROCESS_MARK"
#: Kills at random moments in the source's first seconds, and kills just after its first
#: child appeared (the parse processes are then still importing).
RANDOM_KILLS = 4
KILLS_AFTER_FIRST_CHILD = 3


def _marked(mark: str) -> dict[int, str]:
    """Live processes (not zombies) whose environment carries ``MARK=mark``: pid -> command."""
    needle = f"{MARK}={mark}".encode()
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        if state != "Z":
            found[int(proc.name)] = command
    return found


def _descendants(root: int) -> set[int]:
    """``root``'s children and their children, by parent pid (/proc/*/stat)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def test_kill_9_early_leaves_no_parse_process_and_no_resource_tracker(
    imap: ImapHarness,
) -> None:
    imap.account_name = f"orphans-{imap.unique}"  # no shared transactional id (see the harness)
    config = imap.write_config(parse_workers=2)
    rng = random.Random()
    plans = [("random", rng.uniform(0.0, 4.0)) for _ in range(RANDOM_KILLS)]
    plans += [("after first child", rng.uniform(0.0, 0.5)) for _ in range(KILLS_AFTER_FIRST_CHILD)]
    rng.shuffle(plans)
    seen_children = 0
    for i, (when, delay) in enumerate(plans):
        mark = uuid.uuid4().hex
        source = imap.spawn(config, env={MARK: mark}, log_name=f"source-{i}")
        started = time.monotonic()
        children: set[int] = set()
        if when == "after first child":
            wait_for(lambda p=source.pid: _descendants(p), "the source's first child", timeout=60)
            started = time.monotonic()
        while time.monotonic() - started < delay:
            children |= _descendants(source.pid)
            time.sleep(0.02)
        children |= _descendants(source.pid)
        os.kill(source.pid, signal.SIGKILL)
        source.wait(10)
        seen_children += len(children)
        try:
            wait_for(lambda m=mark: not _marked(m), "every process of the killed source to end", 60)
        except AssertionError:
            left = _marked(mark)
            for pid in left:  # not ours to keep: end them, then fail
                os.kill(pid, signal.SIGKILL)
            raise AssertionError(
                f"kill #{i} ({when}, {delay:.2f}s): left running {left}; "
                f"children seen before the kill: {sorted(children)}"
            ) from None
    print(f"{len(plans)} kills; {seen_children} child processes seen before them, none left")
    assert seen_children, "the kills came before any parse process started: nothing was tested"
