"""The ACLs of ``mailtap dev up --secure``: exactly what ``mailtap acls`` prints for each
component's written config (``<state>/secure/<component>/scram-sha-512.yaml``), nothing more.

The names (topics, groups, transactional-id prefixes) come from the config each component is
given, so the local broker refuses what a company cluster granted the same way would refuse.
``mailtap-admin`` needs none: it is a super user (it creates and aligns every topic). Bindings
of these principals that are not in the computed set (a state dir kept from an older config)
are deleted.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from connectors.core.config import load_config
from mailtap.aclgrant import bindings
from mailtap.acls import component_acls
from mailtap.dev.errors import AclsNotHeld
from mailtap.dev.secure import PRINCIPALS, SecureKafka

log = logging.getLogger(__name__)

__all__ = [
    "bindings",
    "grant_component_acls",
    "hold_exactly",
    "principal_bindings",
    "wanted_bindings",
]

#: dev component -> the ``mailtap acls --component`` it is granted as.
GRANTED_AS = {
    "imap-source": "imap-source",
    "ews-source": "ews-source",
    "streams": "streams",
    "smtp-sink": "smtp-sink",
    "console": "console",
    "other-team": "reader",
}
#: The written config whose names are used (every mechanism's config holds the same names).
CONFIG_MECHANISM = "scram-sha-512"
TIMEOUT_S = 30.0
#: Between reads of what the broker holds after a grant (it applies them within milliseconds).
READ_BACK_INTERVAL_S = 0.2


def wanted_bindings(info: SecureKafka) -> dict[str, list[AclBinding]]:
    """``{principal: bindings}`` of every granted component, from its written config."""
    wanted: dict[str, list[AclBinding]] = {}
    for component, as_component in GRANTED_AS.items():
        config = load_config(info.folder / component / f"{CONFIG_MECHANISM}.yaml", env={})
        principal = PRINCIPALS[component]
        wanted[principal] = bindings(principal, component_acls(config, as_component))
    return wanted


def principal_bindings(admin: AdminClient, principal: str) -> list[AclBinding]:
    """Every binding the broker holds for ``User:principal``."""
    every = AclBindingFilter(
        ResourceType.ANY,
        None,  # type: ignore[arg-type]  # None matches any name (librdkafka)
        ResourcePatternType.ANY,
        f"User:{principal}",
        None,  # type: ignore[arg-type]  # and any host
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    return list(admin.describe_acls(every).result(TIMEOUT_S))


def grant_component_acls(info: SecureKafka) -> dict[str, list[AclBinding]]:
    """Make the broker hold exactly :func:`wanted_bindings` for these principals (through the
    admin listener, a super user). Returns them."""
    # Its log lines through Python logging, not librdkafka's own stderr lines.
    admin = AdminClient({"bootstrap.servers": info.admin_bootstrap, "logger": log})  # type: ignore[dict-item]
    wanted = wanted_bindings(info)
    hold_exactly(admin, wanted)
    return wanted


def hold_exactly(
    admin: AdminClient, wanted: dict[str, list[AclBinding]]
) -> dict[str, list[AclBinding]]:
    """Grant each principal its ``wanted`` bindings and delete any other binding it holds,
    then read back what the broker holds: ``{principal: bindings}``, sorted. Raises
    `AclsNotHeld` when that is not exactly ``wanted`` (``admin`` must be a super user's)."""
    held: dict[str, list[AclBinding]] = {}
    for principal, acls in wanted.items():
        keep = set(acls)
        stale = [b for b in principal_bindings(admin, principal) if b not in keep]
        if stale:
            for future in admin.delete_acls([_filter(b) for b in stale]).values():
                future.result(TIMEOUT_S)
        if acls:
            for future in admin.create_acls(acls).values():
                future.result(TIMEOUT_S)
        held[principal] = _read_back(admin, principal, keep)
        log.info("ACLs of User:%s: %d granted, %d stale removed", principal, len(acls), len(stale))
    return held


def _read_back(admin: AdminClient, principal: str, wanted: set[AclBinding]) -> list[AclBinding]:
    """What the broker holds for ``principal`` once it is ``wanted``. CreateAcls answers when
    the controller has committed the records; the broker serves them to DescribeAcls only once
    it has applied them from the metadata log (a read at once after a grant found none)."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        held = sorted(principal_bindings(admin, principal), key=str)
        if set(held) == wanted and len(held) == len(wanted):
            return held
        if time.monotonic() > deadline:
            missing = sorted(map(str, wanted - set(held)))
            extra = sorted(map(str, set(held) - wanted))
            raise AclsNotHeld(
                f"User:{principal} holds other ACLs than granted after {TIMEOUT_S:.0f} s: "
                f"{len(missing)} missing {missing[:5]}, {len(extra)} extra {extra[:5]}"
            )
        time.sleep(READ_BACK_INTERVAL_S)


def _filter(binding: AclBinding) -> AclBindingFilter:
    return AclBindingFilter(
        binding.restype,
        binding.name,
        binding.resource_pattern_type,
        binding.principal,
        binding.host,
        binding.operation,
        binding.permission_type,
    )
