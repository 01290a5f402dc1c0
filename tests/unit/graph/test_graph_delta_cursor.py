"""The Graph source's pure parts: delta pages, the cursor, the per-mailbox gate."""

from __future__ import annotations

import threading
import time

import pytest

from connectors.graph.cursor import MAX_ITEMS_BYTES, GraphCursor, Tracked, id_digest
from connectors.graph.delta import parse_delta_page
from connectors.graph.errors import GraphProtocolError
from connectors.graph.gate import MailboxGate

ENTRY = {
    "id": "AAkALgAAAAAAHYQDEapmEc2byACqAC-EWg0AAAA=",
    "changeKey": "CQAAABYAAAA",
    "isRead": True,
    "flag": {"flagStatus": "flagged"},
    "categories": ["Blue", 7],
    "receivedDateTime": "2026-11-29T16:08:52Z",
    "internetMessageId": "<order-1@shop.example>",
}


def test_a_page_maps_state_removals_and_links() -> None:
    page = parse_delta_page(
        {
            "@odata.nextLink": "https://graph/next",
            "value": [ENTRY, {"id": "gone", "@removed": {"reason": "deleted"}}],
        }
    )
    assert page.next_link == "https://graph/next" and page.delta_link is None
    first, removed = page.entries
    assert first.flags == ["\\Seen", "\\Flagged", "Blue"]
    assert first.received is not None and first.received.isoformat() == "2026-11-29T16:08:52+00:00"
    assert first.internet_message_id == "<order-1@shop.example>"
    assert removed.removed and removed.message_id == "gone"


def test_the_same_message_twice_in_a_page_is_its_last_state() -> None:
    unread = {**ENTRY, "isRead": False}
    page = parse_delta_page({"@odata.deltaLink": "d", "value": [unread, {"id": "x"}, ENTRY]})
    assert [e.message_id for e in page.entries] == ["x", ENTRY["id"]]
    assert page.entries[-1].is_read


def test_state_digest_ignores_the_change_key_but_not_the_flags() -> None:
    page = parse_delta_page(
        {"@odata.deltaLink": "d", "value": [ENTRY, {**ENTRY, "id": "b", "changeKey": "other"}]}
    )
    a, b = page.entries
    assert a.state_digest == b.state_digest
    unread = parse_delta_page({"@odata.deltaLink": "d", "value": [{**ENTRY, "isRead": False}]})
    assert unread.entries[0].state_digest != a.state_digest


@pytest.mark.parametrize(
    "body",
    [{"value": []}, {"@odata.deltaLink": "d"}, {"@odata.deltaLink": "d", "value": [{"x": 1}]}],
)
def test_a_malformed_page_is_a_protocol_error(body: dict[str, object]) -> None:
    with pytest.raises(GraphProtocolError):
        parse_delta_page(body)


def test_cursor_round_trips_through_the_offset_and_applies_a_page() -> None:
    cursor = GraphCursor(latest_from="2026-12-01T00:00:00+00:00").advanced(
        delta_link=None,
        next_link="https://graph/next",
        seen=[("m1", Tracked("aaaaaaaa", "ops/mid:1@x")), ("m2", Tracked("bbbbbbbb", ""))],
    )
    back = GraphCursor.from_offset(cursor.to_offset())
    assert back == cursor
    assert not back.live and not back.resyncing  # a first round in progress
    assert back.keys() == {"ops/mid:1@x"} and back.tracked("m2") == Tracked("bbbbbbbb", "")
    after = back.advanced(delta_link="https://graph/delta", next_link=None, gone=["m1"])
    assert after.live and after.tracked("m1") is None and after.latest_from == back.latest_from
    assert after.restarted().resyncing  # a dead token: a fresh round compared with the items


def test_cursor_forgets_the_oldest_items_beyond_its_bound() -> None:
    seen = [(f"m{i}", Tracked("aaaaaaaa", f"ops/mid:{i:040d}@x")) for i in range(8_000)]
    cursor = GraphCursor().advanced(delta_link="d", next_link=None, seen=seen)
    assert not cursor.complete
    assert id_digest("m7999") in cursor.items and id_digest("m0") not in cursor.items
    assert sum(len(t.key) + 34 for t in cursor.items.values()) <= MAX_ITEMS_BYTES


def test_gate_bounds_requests_in_flight_per_mailbox() -> None:
    gate = MailboxGate(4)
    in_flight, peak = 0, 0
    lock = threading.Lock()

    def request() -> None:
        nonlocal in_flight, peak
        with gate.slot():
            with lock:
                in_flight += 1
                peak = max(peak, in_flight)
            time.sleep(0.02)
            with lock:
                in_flight -= 1

    threads = [threading.Thread(target=request) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak == 4


def test_gate_holds_every_request_of_the_mailbox_until_retry_after() -> None:
    gate = MailboxGate(4)
    gate.hold_off(0.3)
    started = time.monotonic()
    with gate.slot():
        waited = time.monotonic() - started
    assert waited >= 0.25 and gate.throttled == 1
    stop = threading.Event()
    stop.set()
    gate.hold_off(30)
    with gate.slot(stop):  # stopping: no 30 s wait
        pass
