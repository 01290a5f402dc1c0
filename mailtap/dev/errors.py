"""Errors of the local real-service runners, under :class:`connectors.core.errors.MailtapError`."""

from __future__ import annotations

import subprocess

from connectors.core.errors import MailtapError


class ServiceStartError(MailtapError, RuntimeError):
    """A local service did not come up; the message quotes the tail of its log."""


class DoveadmError(MailtapError, subprocess.CalledProcessError):
    """doveadm exited non-zero; unlike its base class, str() includes doveadm's stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stderr}"


class ClientGone(MailtapError, ConnectionError):
    """The Courier login front end's client went away before logging in."""


class AclsNotHeld(MailtapError, RuntimeError):
    """After a grant, the broker holds other ACLs for a principal than the ones granted."""
