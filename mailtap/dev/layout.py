"""Where the development services find their templates, jars and default state."""

from __future__ import annotations

import os
from pathlib import Path

#: The repository checkout this package runs from (``pip install -e``): the dev services are a
#: development tool and read their templates and the Maven-resolved Kafka jars from it.
REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = REPO_ROOT / "deploy" / "local"
DEFAULT_STATE_DIR = REPO_ROOT / ".state" / "dev"

#: ``off`` makes ``mailtap dev up`` start no schema registry and write a registry-less config.
ENV_DEV_REGISTRY = "MAILTAP_DEV_REGISTRY"
#: Overrides the folder holding the Kafka jars (default: ``.cache/kafka/libs`` in the checkout).
ENV_KAFKA_LIBS = "MAILTAP_KAFKA_LIBS"


def kafka_libs() -> Path:
    return Path(os.environ.get(ENV_KAFKA_LIBS, REPO_ROOT / ".cache" / "kafka" / "libs"))


def render_template(name: str, values: dict[str, str]) -> str:
    """Fill ``${key}`` placeholders of ``deploy/local/<name>``; a missing key raises KeyError."""
    from string import Template

    return Template((TEMPLATES / name).read_text()).substitute(values)
