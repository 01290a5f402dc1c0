"""The soak's own service set: Kafka with one listener per component instance (each behind a
fault proxy), the schema registry, Dovecot and the soak relay, all tied to the harness.

Kafka clients learn broker addresses from the metadata, so a plain TCP proxy in front of the
bootstrap port would be bypassed after the first request. Each component instance therefore gets
a listener of its own whose *advertised* address is its proxy: every byte between that instance
and the broker crosses the proxy, and a fault hits that instance alone. The harness, the
verifier and ``topics ensure`` use the plain listener.

Every process is spawned with ``PR_SET_PDEATHSIG`` (`mailtap.dev.process.tie_services_to_this_process`):
a ``kill -9`` of the harness takes the broker, the registry, Dovecot and the components with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mailtap.dev import dovecot, kafka, process, registry
from mailtap.dev.errors import ServiceStartError
from mailtap.dev.tcp_proxy import TcpProxy

HOST = "127.0.0.1"
#: How long a broker restart may take in all (several start-up waits) before the fault fails.
KAFKA_RESTART_PATIENCE_S = 600.0


@dataclass
class Stack:
    """Running services of one soak run; ``restart_*`` are the faults' second halves."""

    root: Path
    instances: tuple[str, ...]
    kafka_layout: kafka.KafkaLayout = field(init=False)
    kafka_pid: int = 0
    bootstrap: str = ""
    broker_port: int = 0
    controller_port: int = 0
    #: listener port on the broker per instance, and the proxy in front of it
    kafka_proxies: dict[str, TcpProxy] = field(default_factory=dict)
    imap_port: int = 0
    imap_pid: int = 0
    imap_layout: dovecot.DovecotLayout | None = None
    imap_proxies: dict[str, TcpProxy] = field(default_factory=dict)
    registry_dir: Path = field(init=False)
    registry_port: int = 0
    registry_url: str = ""
    registry_pid: int = 0
    started_groups: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.kafka_layout = kafka.KafkaLayout(self.root / "kafka")
        self.registry_dir = self.root / "registry"

    # --- start -----------------------------------------------------------------------------

    def start(self) -> Stack:
        process.tie_services_to_this_process()
        self.root.mkdir(parents=True, exist_ok=True)
        # Every server port at once, held while the proxies bind theirs: two picks one after
        # another can return one port twice, which the broker refuses (CI, stop 35).
        with process.reserved_ports(4 + len(self.instances), HOST) as ports:
            self.broker_port, self.controller_port, self.registry_port, self.imap_port = ports[:4]
            listeners = dict(zip(self.instances, ports[4:], strict=True))
            for name, port in listeners.items():
                self.kafka_proxies[name] = TcpProxy(HOST, port).start()
        self.bootstrap = f"{HOST}:{self.broker_port}"
        kafka.render(self.kafka_layout, HOST, self.broker_port, self.controller_port)
        self._configure_kafka(listeners)
        self._start_kafka(wait=False)
        self._start_registry(wait=False)
        self.imap_layout = dovecot.layout_for(self.root)
        dovecot.render(self.imap_layout, HOST, self.imap_port)
        self._start_imap()
        for name in self.instances:
            self.imap_proxies[name] = TcpProxy(HOST, self.imap_port).start()
        kafka.wait_ready(self.kafka_layout, self.kafka_pid, self.bootstrap)
        registry.wait_ready(
            self.registry_dir,
            registry.RunningRegistry(self.registry_url, self.registry_pid, self.registry_port),
        )
        return self

    def _configure_kafka(self, listeners: dict[str, int]) -> None:
        """The instances' listeners on the rendered broker config, then its storage."""
        add_listeners(self.kafka_layout.config, listeners, self.kafka_proxies)
        kafka.prepare_storage(self.kafka_layout, self.broker_port, self.controller_port)

    def kafka_address(self, instance: str) -> str:
        """The bootstrap address an instance uses: its own proxy."""
        return f"{HOST}:{self.kafka_proxies[instance].port}"

    def kafka_client(self, instance: str) -> dict[str, Any]:
        """The connection settings of an instance's ``kafka:`` section."""
        return {"bootstrap_servers": self.kafka_address(instance)}

    def grant_acls(self, configs: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
        """ACLs for the instances' principals, from their configs (``{instance: config}``);
        returns what the broker holds per principal. A plaintext broker has no principals."""
        return {}

    def denied(self) -> dict[str, list[str]]:
        """Operations the broker refused, per principal (none without an authorizer)."""
        return {}

    def imap_address(self, instance: str) -> tuple[str, int]:
        return HOST, self.imap_proxies[instance].port

    def _record(self, pid: int) -> int:
        self.started_groups.append(pid)
        return pid

    def _start_kafka(self, *, wait: bool) -> None:
        self.kafka_pid = self._record(kafka.start(self.kafka_layout))
        if wait:
            kafka.wait_ready(self.kafka_layout, self.kafka_pid, self.bootstrap)

    def _start_registry(self, *, wait: bool) -> None:
        running = registry.launch(self.registry_dir, HOST, self.registry_port)
        self.registry_url, self.registry_pid = running.url, self._record(running.pid)
        if wait:
            registry.wait_ready(self.registry_dir, running)

    def _start_imap(self) -> None:
        assert self.imap_layout is not None
        self.imap_pid = self._record(dovecot.start(self.imap_layout))
        dovecot.wait_ready(self.imap_layout, self.imap_pid, HOST, self.imap_port)

    # --- faults ----------------------------------------------------------------------------

    def kill_kafka(self) -> None:
        _kill_group(self.kafka_pid)

    def restart_kafka(self, patience_s: float = KAFKA_RESTART_PATIENCE_S) -> None:
        """Start the broker again and wait until it answers. Its log recovery after a kill -9
        can outlast one start-up wait on a loaded machine: a broker still starting is waited
        for again, one that died is started again, until ``patience_s`` runs out."""
        deadline = time.monotonic() + patience_s
        self._start_kafka(wait=False)
        while True:
            try:
                kafka.wait_ready(self.kafka_layout, self.kafka_pid, self.bootstrap)
                return
            except ServiceStartError:
                if time.monotonic() > deadline:
                    raise
                if not process.is_alive(self.kafka_pid):
                    self._start_kafka(wait=False)

    def stop_registry(self) -> None:
        _kill_group(self.registry_pid)

    def restart_registry(self) -> None:
        self._start_registry(wait=True)

    def restart_imap(self) -> None:
        """Dovecot stopped as an operator would (SIGTERM to its group), then started again."""
        process.stop_group(self.imap_pid, timeout=10)
        self._start_imap()

    # --- stop ------------------------------------------------------------------------------

    def add_users(self, accounts: list[tuple[str, str]]) -> None:
        assert self.imap_layout is not None
        dovecot.add_users(self.imap_layout.passwd_file, accounts)

    def stop(self) -> None:
        for proxy in [*self.kafka_proxies.values(), *self.imap_proxies.values()]:
            with contextlib.suppress(Exception):
                proxy.close()
        for pgid in reversed(self.started_groups):
            process.stop_group(pgid, timeout=10)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    process.stop_group(pgid, timeout=5)  # reaps it


def add_listeners(
    config: Path,
    listeners: dict[str, int],
    proxies: dict[str, TcpProxy],
    protocol: str = "PLAINTEXT",
) -> dict[str, str]:
    """One listener per instance (``protocol``: PLAINTEXT, SSL or SASL_SSL), advertised at that
    instance's proxy. Returns the listener name of each instance."""
    names = {instance: f"I{n}" for n, instance in enumerate(listeners)}
    lines = []
    for line in config.read_text().splitlines():
        if line.startswith("listeners="):
            line += "".join(f",{names[i]}://{HOST}:{p}" for i, p in listeners.items())
        elif line.startswith("advertised.listeners="):
            line += "".join(f",{names[i]}://{HOST}:{proxies[i].port}" for i in listeners)
        elif line.startswith("listener.security.protocol.map="):
            line += "".join(f",{n}:{protocol}" for n in names.values())
        lines.append(line)
    config.write_text("\n".join(lines) + "\n")
    return names
