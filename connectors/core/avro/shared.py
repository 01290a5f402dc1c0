"""The named types more than one topic schema uses (``schemas/io.mailtap.v1.*.avsc``), as
TypedDicts: the mail event (:mod:`connectors.core.mail.event`) and the reply command
(:mod:`connectors.core.avro.replies`) share them. Kept apart so that a reader of one contract
does not import the other (streams never loads the MIME parser for a type)."""

from __future__ import annotations

from typing import TypedDict

__all__ = ["Address"]


class Address(TypedDict):
    """``io.mailtap.v1.Address`` (schemas/io.mailtap.v1.Address.avsc): one mail address."""

    name: str | None
    address: str
