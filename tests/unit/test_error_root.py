"""Every exception mailtap defines lives in its package's ``errors.py`` under one root,
:class:`connectors.core.errors.MailtapError` (STYLE.md rule 4)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import connectors
import mailtap
import streams
from connectors.core.errors import MailtapError

#: Still outside an errors module: none.
PENDING: set[str] = set()


def _defined_exceptions() -> list[type[BaseException]]:
    found = []
    for package in (connectors, streams, mailtap):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            module = importlib.import_module(info.name)
            for _, value in inspect.getmembers(module, inspect.isclass):
                if issubclass(value, BaseException) and value.__module__ == info.name:
                    found.append(value)
    return found


def test_every_exception_is_defined_in_an_errors_module_under_the_root() -> None:
    exceptions = _defined_exceptions()
    assert len(exceptions) > 20  # the walk found the packages' errors
    misplaced = sorted(
        f"{e.__module__}.{e.__qualname__}"
        for e in exceptions
        if not (e.__module__.endswith(".errors") and issubclass(e, MailtapError))
    )
    assert set(misplaced) == PENDING
