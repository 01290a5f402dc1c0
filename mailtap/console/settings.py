"""The ``console`` section of the configuration (``mailtap run console``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from connectors.core.config import StrictModel


class ConsoleSettings(StrictModel):
    """The operator console: where it listens, who may use it, how much it reads."""

    host: str = Field(
        default="127.0.0.1",
        description="listen address; loopback unless you mean to expose it (0.0.0.0 in a "
        "container, behind TLS termination)",
    )
    port: int = Field(default=8088, ge=0, le=65535, description="HTTP port (0 picks a free one)")
    tokens_file: Path = Field(
        description="YAML list of {name, role: viewer|operator, token} (a mounted Kubernetes "
        "Secret); viewer may only read, operator may also act. Re-read when it changes"
    )
    max_body_bytes: int = Field(
        default=65536, gt=0, description="a request body larger than this is refused (413)"
    )
    page_size: int = Field(
        default=50, ge=1, le=1000, description="rows per page of the mailbox and DLQ tables"
    )
    refresh_seconds: float = Field(
        default=15.0,
        gt=0,
        description="how often the mailbox table, the DLQ list and the charts are re-read from "
        "Kafka (an action re-reads at once)",
    )
    secure_cookie: bool = Field(
        default=False,
        description="mark the login cookie Secure (only sent over HTTPS): set it when a TLS "
        "proxy fronts the console",
    )
