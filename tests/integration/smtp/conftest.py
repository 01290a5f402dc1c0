"""Fixtures of the SMTP sink's integration tests (the Kafka comes from tests/conftest.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from smtp_scripted_server import ScriptedRelay


@pytest.fixture
def relay() -> Iterator[ScriptedRelay]:
    with ScriptedRelay(stall_seconds=4.0) as server:
        yield server
