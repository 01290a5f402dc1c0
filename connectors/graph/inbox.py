"""What a notification collection means to the source, whichever way it came (the webhook or
Azure Event Hubs): each entry whose ``clientState`` is ours wakes its folder up, a lifecycle
entry also says what to do with the subscription. Pure routing: it never publishes anything.

Wire sample (a collection; lifecycle entries carry ``lifecycleEvent`` instead of ``changeType``)::

    {"value": [{"subscriptionId": "7f105c7d-2dc5-4530-97cd-4e7ae6534c07",
                "clientState": "secretClientValue", "changeType": "created",
                "resource": "Users/{id}/Messages/{id}", "tenantId": "...",
                "resourceData": {"@odata.type": "#Microsoft.Graph.Message", "id": "AAk..."}}]}
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["NotificationInbox"]

#: The subscription id of Event Hubs' validation message (change-notifications-delivery-event-hubs).
VALIDATION_SUBSCRIPTION = "NA"


class NotificationInbox:
    """``on_change(subscription_id)`` and ``on_lifecycle(subscription_id, event)`` must not
    block (they set events)."""

    def __init__(
        self,
        client_state: str,
        on_change: Callable[[str], None],
        on_lifecycle: Callable[[str, str], None],
    ) -> None:
        self._state = client_state.encode()
        self._on_change = on_change
        self._on_lifecycle = on_lifecycle
        #: Notifications ignored because their clientState was not ours.
        self.rejected = 0

    def collection(self, body: Any) -> None:
        entries = body.get("value") if isinstance(body, dict) else None
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, dict):
                continue
            subscription_id = str(entry.get("subscriptionId") or "")
            if subscription_id == VALIDATION_SUBSCRIPTION:
                continue  # Event Hubs' reachability test at subscription time
            # Constant time: the clientState is the shared secret that authenticates Graph.
            state = str(entry.get("clientState") or "").encode()
            if not hmac.compare_digest(state, self._state):
                self.rejected += 1
                log.warning("graph notifications: a wrong clientState, ignored")
                continue
            event = entry.get("lifecycleEvent")
            if event:
                self._on_lifecycle(subscription_id, str(event))
            else:
                self._on_change(subscription_id)
