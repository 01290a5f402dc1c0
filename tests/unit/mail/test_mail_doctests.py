"""The wire samples in the docstrings are examples that must stay true."""

from __future__ import annotations

import doctest
import importlib

import pytest

pytestmark = pytest.mark.unit

MODULES = [
    "connectors.core.claimcheck.local",
    "connectors.core.checkpoints",
    "connectors.core.source.settings",
    "connectors.core.mail.addresses",
    "connectors.core.mail.budget",
    "connectors.core.mail.charsets",
    "connectors.core.mail.encodedwords",
    "connectors.core.mail.headers",
    "connectors.core.mail.identity",
    "connectors.core.mail.params",
    "connectors.core.mail.parse",
    "tests.support.crashpoints",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0
    assert result.failed == 0
