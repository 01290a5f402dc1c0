"""A bench pointed at another state dir (MAILTAP_BENCH_STATE_DIR, shared with tests and other
benches) never starts, and so never first tears down, services that do not answer right now."""

from __future__ import annotations

from pathlib import Path

import pytest

from mailtap.bench import ingest


def test_a_shared_state_dir_that_does_not_answer_is_reported_not_restarted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    started: list[Path] = []
    monkeypatch.setenv(ingest.ENV_STATE_DIR, str(tmp_path))
    monkeypatch.setattr(ingest, "status", lambda _dir: None)
    monkeypatch.setattr(ingest, "up", lambda state_dir: started.append(state_dir))
    with pytest.raises(RuntimeError, match="mailtap dev up --state-dir"):
        ingest._services()
    assert started == []
