"""Smoke test of ``mailtap bench reconnect`` on a small folder: both expunge checks find the
very UIDs the bench expunged, and the QRESYNC one sends no listing (figures are not judged)."""

from __future__ import annotations

import pytest

from mailtap.bench import reconnect
from mailtap.dev import DevServices


def test_the_reconnect_bench_finds_the_same_expunges_both_ways(
    services: DevServices, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reconnect, "_services", lambda: services)
    figures = reconnect.bench_reconnect(json_out=True, mails=300, expunged=10, rounds=1)
    assert figures["expunged"] == 10 and figures["same_gone_uids"] is True
    for name in ("listing", "listing_plain_search", "qresync"):
        assert figures[name]["gone_found"] == 10
    # SELECT + SEARCH (and ENABLE) against one SELECT with the QRESYNC parameter (and ENABLE).
    assert figures["listing"]["commands"] == figures["qresync"]["commands"] + 1
    # Without ESEARCH the listing answer names every UID; VANISHED names the 10.
    assert figures["listing_plain_search"]["bytes_read"] > figures["qresync"]["bytes_read"]
