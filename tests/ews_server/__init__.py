"""A protocol-faithful Exchange Web Services (EWS) test server; see ``server.py``."""

from .mailbox import ExchangeStore, Item, Mailbox
from .server import ENDPOINT_PATH, EwsTestServer, RequestRecord

__all__ = ["ENDPOINT_PATH", "EwsTestServer", "ExchangeStore", "Item", "Mailbox", "RequestRecord"]
