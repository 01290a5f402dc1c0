"""What the folder workers of one mailbox share: its request budget and client, the ids of its
watched folders, and which keys each watched folder holds.

A mail moved between two watched folders leaves one folder's delta (``@removed``) and enters the
other's with the same immutable id and the same key; the two workers see their halves in either
order. This is what lets them agree without another request:

- the arriving folder publishes ``UPDATED`` (not ``ADDED``) for a key another watched folder
  holds, or one that just left a watched folder for another (``moved_keys``);
- the departing folder publishes a tombstone only when no watched folder holds the key: not in
  another worker's cursor, and not in a watched folder according to Graph (``GET
  /messages/{immutable id}``: its ``parentFolderId``, as the arrival may not be synced yet).

All folders of a mailbox run in one process (the work units are placed by account), so this
in-memory view covers every watched folder. After a restart it is rebuilt from the cursors.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from connectors.graph.client import GraphClient

__all__ = ["GraphMailbox"]

#: Keys remembered as "moved to another watched folder" at most (the newest kept).
MAX_MOVED_KEYS = 10_000


class GraphMailbox:
    """One mailbox's shared state; thread-safe."""

    def __init__(self, account: str, client_factory: Callable[[], GraphClient]) -> None:
        self.account = account
        self._client_factory = client_factory
        self._client: GraphClient | None = None
        self._lock = threading.Lock()
        self._folder_ids: dict[str, str] = {}
        self._keys: dict[str, set[str]] = {}
        self._moved: dict[str, None] = {}
        #: The folders of this mailbox that have a worker here (configured or added at runtime).
        self._watched: set[str] = set()

    @property
    def client(self) -> GraphClient:
        with self._lock:
            if self._client is None:
                self._client = self._client_factory()
            return self._client

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    # --- watched folders ------------------------------------------------------------------

    def resolve(self, folder: str) -> str:
        """The Graph id of a watched folder (``inbox`` -> ``AAMkAGI2...``), asked once."""
        with self._lock:
            known = self._folder_ids.get(folder)
        if known is not None:
            return known
        folder_id = self.client.folder_id(folder)
        with self._lock:
            self._folder_ids[folder] = folder_id
        return folder_id

    def watch(self, folder: str) -> None:
        """A worker for ``folder`` of this mailbox runs here from now on."""
        with self._lock:
            self._watched.add(folder)

    def watched_ids(self) -> frozenset[str]:
        """The ids of every watched folder of the mailbox (resolved on first use)."""
        with self._lock:
            folders = sorted(self._watched)
        return frozenset(self.resolve(folder) for folder in folders)

    # --- keys per folder ------------------------------------------------------------------

    def holds(self, folder: str, keys: set[str]) -> None:
        """``folder``'s committed cursor publishes these keys now."""
        with self._lock:
            self._keys[folder] = set(keys)
            for key in keys:
                self._moved.pop(key, None)

    def held_elsewhere(self, folder: str, key: str) -> bool:
        """Whether another watched folder holds ``key``, or it just moved to one."""
        with self._lock:
            if key in self._moved:
                return True
            return any(key in keys for name, keys in self._keys.items() if name != folder)

    def moved(self, key: str) -> None:
        """``key`` left a watched folder for another watched folder (seen by Graph)."""
        with self._lock:
            self._moved[key] = None
            while len(self._moved) > MAX_MOVED_KEYS:
                del self._moved[next(iter(self._moved))]

    def forget(self, folder: str) -> None:
        """The worker of ``folder`` ended."""
        with self._lock:
            self._keys.pop(folder, None)
            self._watched.discard(folder)
