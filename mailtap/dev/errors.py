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
