"""The registry subjects of one topic, set up the way the contract says before the first write.

For a topic ``T`` mailtap uses TopicNameStrategy subjects and, before it writes there:

1. sets the compatibility of ``T-key`` and ``T-value`` (``kafka.schema_compatibility``,
   FULL_TRANSITIVE by default). A registry's own default is no guarantee: Apicurio's ccompat API
   answers ``NONE`` for a subject nobody configured, Confluent's default is BACKWARD (which lets a
   change through that breaks readers still on the old schema);
2. registers the key schema ``"string"`` under ``T-key``, so a catalogue of the registry shows the
   key's type. The key bytes themselves stay plain UTF-8 (schemas/README.md, "Keys");
3. registers the value schema under ``T-value``; a registry that refuses it (incompatible with
   what is registered, or invalid) stops the component with a sentence that says what to do.

Wire sample (Confluent REST API, which Apicurio serves under ``/apis/ccompat/v7``)::

    PUT /config/mail.events-value            {"compatibility": "FULL_TRANSITIVE"}
    POST /subjects/mail.events-value/versions {"schema": "{...}", "schemaType": "AVRO"} -> {"id": 3}
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import cache, partial
from typing import Any

from connectors.core.config import DEFAULT_COMPATIBILITY, Compatibility
from connectors.core.errors import ConfigError

log = logging.getLogger(__name__)

#: Keys are UTF-8 strings (message identity, command id, instance id).
KEY_SCHEMA = '"string"'

_prepared: set[tuple[str, str, str]] = set()
_lock = threading.Lock()

#: Attempts at one registry call that failed transiently (see `_transient`), with a doubling
#: pause from REGISTRY_RETRY_PAUSE_S: ~6 s in all, enough for a registry busy with the other
#: components' registrations at the same start.
REGISTRY_ATTEMPTS = 5
REGISTRY_RETRY_PAUSE_S = 0.4


@cache
def registry_client(url: str) -> Any:
    """One client per registry URL and process: its schema-id cache is shared by every serde."""
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "a schema registry is configured but confluent-kafka's registry support is "
            "missing: pip install 'confluent-kafka[avro,schemaregistry]'"
        ) from exc
    return SchemaRegistryClient.new_client({"url": url})


def prepare_subjects(
    url: str, topic: str, value_schema: str, compatibility: Compatibility = DEFAULT_COMPATIBILITY
) -> int:
    """Set both subjects' compatibility and register key and value schema; once per process and
    (url, topic, schema). Returns the value schema's id."""
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    client = registry_client(url)
    schema_id = 0
    with _lock:
        # confluent-kafka's in-memory mock registry (mock://, unit tests) has no /config.
        done = (url, topic, value_schema) in _prepared or url.startswith("mock://")
        for subject, text in ((f"{topic}-key", KEY_SCHEMA), (f"{topic}-value", value_schema)):
            try:
                if not done:
                    _retrying(
                        partial(client.set_compatibility, subject_name=subject, level=compatibility)
                    )
                schema_id = _retrying(
                    partial(client.register_schema, subject, Schema(text, "AVRO"))
                )
            except SchemaRegistryError as exc:
                raise _refused(url, subject, compatibility, exc) from exc
        if not done:
            _prepared.add((url, topic, value_schema))
            log.info(
                "registry subjects ready",
                extra={"topic": topic, "compatibility": compatibility, "schema_id": schema_id},
            )
    return int(schema_id)


def _transient(exc: Exception) -> bool:
    """A failure that the same request, repeated, gets past.

    Apicurio 2.4's SQL storage (the local registry, `mailtap.dev.registry`) races when several
    components register at the same time, as they do when they start together: HTTP 500 (H2
    lock timeouts, duplicate keys in its id sequences and in the content table, since the key
    schema ``"string"`` is one content for every ``T-key``), then a 409 "already exists" for
    the subject the failed request half-created, or a 200 without an id (confluent-kafka's
    client then fails on ``int(None)``). The same request alone succeeds. A 5xx from any
    registry (restarting, overloaded) is worth the same few retries.
    """
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    if isinstance(exc, SchemaRegistryError):
        status = exc.http_status_code or 0
        return status >= 500 or (status == 409 and "already exists" in str(exc.error_message))
    return isinstance(exc, TypeError)


def _retrying(call: Callable[[], Any]) -> Any:
    for attempt in range(1, REGISTRY_ATTEMPTS + 1):
        try:
            return call()
        except Exception as exc:
            if attempt == REGISTRY_ATTEMPTS or not _transient(exc):
                raise
            log.warning(
                "schema registry call failed, retrying",
                extra={"attempt": attempt, "error": str(exc)[:200]},
            )
            time.sleep(REGISTRY_RETRY_PAUSE_S * 2 ** (attempt - 1))
    raise AssertionError("unreachable")


def _refused(url: str, subject: str, compatibility: str, exc: Any) -> ConfigError:
    status = exc.http_status_code
    if status == 409:
        return ConfigError(
            f"the schema registry at {url} refuses the schema for {subject}: it is not "
            f"{compatibility}-compatible with the versions registered there "
            f"({exc.error_message}). If {subject} holds the first released io.mailtap.v1 schema "
            f"(enums without a default symbol), set kafka.schema_compatibility: "
            f"BACKWARD_TRANSITIVE for it; otherwise the subject holds a schema that is not "
            f"mailtap's: use new topic names (kafka.topics.*). See schemas/README.md, "
            f"'Compatibility'"
        )
    if status == 422:
        return ConfigError(
            f"the schema registry at {url} rejects the schema for {subject} as invalid "
            f"({exc.error_message}); this build's schemas/ is broken, not the configuration"
        )
    return ConfigError(
        f"the schema registry at {url} failed for {subject} (HTTP {status}: "
        f"{exc.error_message}); check kafka.schema_registry_url and that the registry runs"
    )
