"""Errors of the console's access checks, under :class:`connectors.core.errors.MailtapError`;
the app answers them as 401 and 403."""

from __future__ import annotations

from connectors.core.errors import MailtapError


class Unauthorized(MailtapError):
    """No token, or one the tokens file does not have."""


class Forbidden(MailtapError):
    """A valid token whose role may not do this (a viewer's POST)."""


class BadCsrfToken(Forbidden):
    """A form without the CSRF token of the login it came with."""
