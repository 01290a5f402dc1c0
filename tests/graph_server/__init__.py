"""A protocol-faithful Microsoft Graph (mail) test server; see ``server.py`` and README.md."""

from .errors import GraphError
from .mailbox import GraphStore, Mailbox, MailFolder, Message
from .server import DEFAULT_TENANT, GraphTestServer, RequestRecord

__all__ = [
    "DEFAULT_TENANT",
    "GraphError",
    "GraphStore",
    "GraphTestServer",
    "MailFolder",
    "Mailbox",
    "Message",
    "RequestRecord",
]
