"""Scrape a component's ``/metrics`` and ``/healthz`` the way Prometheus and a probe do."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from mailtap.commands.streams_health import mails_read_again

#: {(sample name, frozenset of label items): value}
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int, host: str = "127.0.0.1") -> Samples:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def families(port: int, host: str = "127.0.0.1") -> set[str]:
    """Every metric a component declares (HELP/TYPE), with or without samples yet: a labelled
    counter has no sample until its first label set is used, yet Prometheus rules on it are valid."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = set()
    for family in text_string_to_metric_families(text):
        found.add(family.name)
        found |= {s.name for s in family.samples}
    return found


def healthz(port: int, host: str = "127.0.0.1") -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= lab)


def deduped(port: int) -> int:
    """:func:`mailtap.commands.streams_health.mails_read_again`, 0 while the worker does not serve
    /metrics yet."""
    try:
        return mails_read_again(port)
    except OSError:
        return 0


def names(samples: Samples) -> set[str]:
    return {n for n, _ in samples}


def wait_for(check: Callable[[], bool], what: str, deadline_s: float = 180.0) -> None:
    """Poll ``check`` until true; the deadline only guards against a hang."""
    end = time.monotonic() + deadline_s
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.5)
