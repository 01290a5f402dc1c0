"""Local real services for development, tests and the demo: Kafka (KRaft), a schema registry,
Dovecot, SMTP.

from mailtap.dev import up, down, status
info = up(".state/dev")           # DevServices: connection details + test helpers
info.kafka.bootstrap_servers, info.imap.port, info.smtp.received_dir, info.config_path
down(".state/dev")                # stops exactly the processes `up` started
"""

from mailtap.dev.errors import ServiceStartError
from mailtap.dev.received import ReceivedMessage, received_messages
from mailtap.dev.services import (
    Account,
    DevServices,
    ImapInfo,
    KafkaInfo,
    RegistryInfo,
    SmtpInfo,
    down,
    healthy,
    status,
    up,
)

__all__ = [
    "Account",
    "DevServices",
    "ImapInfo",
    "KafkaInfo",
    "ReceivedMessage",
    "RegistryInfo",
    "ServiceStartError",
    "SmtpInfo",
    "down",
    "healthy",
    "received_messages",
    "status",
    "up",
]
