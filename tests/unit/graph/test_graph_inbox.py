"""What a notification collection wakes up: only entries with our clientState."""

from __future__ import annotations

from connectors.graph.inbox import NotificationInbox


def test_entries_route_by_subscription_and_a_wrong_client_state_is_ignored() -> None:
    changes: list[str] = []
    lifecycle: list[tuple[str, str]] = []
    inbox = NotificationInbox("ours-12345", changes.append, lambda s, e: lifecycle.append((s, e)))
    inbox.collection(
        {
            "value": [
                {"subscriptionId": "a", "clientState": "ours-12345", "changeType": "created"},
                {"subscriptionId": "b", "clientState": "forged", "changeType": "created"},
                {"subscriptionId": "c", "changeType": "updated"},
                {"subscriptionId": "a", "clientState": "ours-12345", "lifecycleEvent": "missed"},
                {"subscriptionId": "NA", "changeType": "Validation: Testing client application"},
                "not an entry",
            ]
        }
    )
    inbox.collection({"unexpected": True})
    assert changes == ["a"]
    assert lifecycle == [("a", "missed")]
    assert inbox.rejected == 2
