"""The Microsoft Entra ID app registration as settings: what the Graph source (``graph``) and the
SMTP sink's Graph transport (``smtp.graph``) both declare, declared once.

Each section subclasses :class:`EntraAppSettings` and keeps its own rule about which credential
it takes (the source also logs in with a delegated refresh token; the sink is app-only), so a
misconfiguration is still refused with that section's sentence.

Example (either section)::

    tenant_id: 72f988bf-86f1-41af-91ab-2d7cd011db47
    client_id: 3f1c2b7e-0d4c-4a8e-9d35-5b1f0f3b9e21
    client_secret_file: /run/secrets/graph-secret   # or client_secret, or certificate_file
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator

from connectors.core.config import StrictModel


class EntraAppSettings(StrictModel):
    """The application (tenant, client id, its secret or certificate) and the endpoints it is
    reached at: Microsoft's public cloud by default; a national cloud, or a test server on
    loopback (plain ``http://`` only there). Secrets are ``SecretStr`` or a ``*_file`` read
    when used (a mounted Kubernetes secret); never logged."""

    tenant_id: str = Field(min_length=1, description="the Microsoft Entra tenant (id or domain)")
    client_id: str = Field(min_length=1, description="the application (client) id")
    client_secret: SecretStr | None = Field(
        default=None, description="the application's secret (never logged)"
    )
    client_secret_file: Path | None = Field(
        default=None, description="file holding the client secret (instead of client_secret)"
    )
    certificate_file: Path | None = Field(
        default=None,
        description="PEM with the application's certificate and its private key (instead of "
        "a secret)",
    )
    certificate_password: SecretStr | None = Field(
        default=None, description="passphrase of the certificate's private key, if any"
    )
    authority_host: str = Field(
        default="https://login.microsoftonline.com",
        description="the identity platform; the tenant is appended",
    )
    api_base: str = Field(
        default="https://graph.microsoft.com/v1.0", description="Graph's REST root"
    )
    ca_file: str | None = Field(default=None, description="CA bundle; the system store if unset")

    @field_validator("authority_host", "api_base")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme == "https" and parts.hostname:
            return value.rstrip("/")
        if parts.scheme == "http" and parts.hostname and is_loopback(parts.hostname):
            return value.rstrip("/")
        raise ValueError("expected an https:// URL (http only on loopback)")

    def secret(self) -> str | None:
        """The client secret, from the YAML/env or its file."""
        return read_secret(self.client_secret, self.client_secret_file)


def read_secret(value: SecretStr | None, path: Path | None) -> str | None:
    """``value`` revealed, else the content of ``path`` (stripped), else None."""
    if value is not None:
        return value.get_secret_value()
    if path is not None:
        return path.read_text(encoding="utf-8").strip()
    return None


def require_files(paths: Iterable[Path | None]) -> None:
    """Refuse a ``*_file`` setting that names no file (at start, not at the first token)."""
    for path in paths:
        if path is not None and not path.is_file():
            raise ValueError(f"{path} does not exist; write the secret there or fix the path")


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses: where plain http is allowed (test servers)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
