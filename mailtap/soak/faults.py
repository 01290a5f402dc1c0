"""Seeded random faults, one every 10-60 s, each with its healing step.

=================== =========================================================================
kind                what happens
=================== =========================================================================
kill                kill -9 of one component instance; the harness starts it again 1-5 s later
broker-kill         kill -9 of the Kafka broker; started again 2-10 s later
imap-restart        Dovecot stopped and started again
relay-421 / -451    the relay answers 421 to MAIL / 451 to DATA for 10-40 s
registry-down       the schema registry killed for 10-40 s
net-latency         +50-400 ms per chunk between one instance and Kafka / IMAP / SMTP, 10-30 s
net-stall           that path stops forwarding for 2-8 s (connections stay open)
net-reset           every open connection of that path reset (RST)
net-partition       that path silent for 5-30 s (new connections hang too), then reset
=================== =========================================================================
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mailtap.dev.tcp_proxy import TcpProxy
from mailtap.soak.fleet import Instance
from mailtap.soak.relay import SoakRelay
from mailtap.soak.stack import Stack

log = logging.getLogger(__name__)

KINDS = {
    "kill": 30,
    "broker-kill": 6,
    "imap-restart": 6,
    "relay-421": 5,
    "relay-451": 5,
    "registry-down": 5,
    "net-latency": 10,
    "net-stall": 10,
    "net-reset": 12,
    "net-partition": 11,
}
GAP_S = (10.0, 60.0)
#: An instance that exits this long after a fault that touched it gave up on purpose (Kafka's
#: transaction timeout is 60 s); later, or without such a fault, the exit is a crash.
EXIT_WINDOW_S = 120.0


@dataclass
class Fault:
    at: float  # seconds since the run's start
    kind: str
    target: str
    duration: float = 0.0
    healed_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "at_s": round(self.at, 1),
            "kind": self.kind,
            "target": self.target,
            "duration_s": round(self.duration, 1),
            "healed_at_s": None if self.healed_at is None else round(self.healed_at, 1),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Fault:
        return cls(doc["at_s"], doc["kind"], doc["target"], doc["duration_s"], doc["healed_at_s"])


@dataclass
class FaultInjector:
    rng: random.Random
    stack: Stack
    relay: SoakRelay
    instances: dict[str, Instance]
    started: float
    faults: list[Fault] = field(default_factory=list)
    #: sinks touched by a fault, summed over the faults: each touch may leave pool_size mails
    #: UNKNOWN, resent later (see `sinks_disrupted`)
    sink_disruptions: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    #: False for a baseline run: the workload and the verifier without any fault
    inject: bool = True
    _pending: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)
    _seq: Any = field(default_factory=itertools.count)
    _injecting: bool = field(init=False)
    _heal_now: threading.Event = field(default_factory=threading.Event)
    _healed: threading.Event = field(default_factory=threading.Event)
    _closed: threading.Event = field(default_factory=threading.Event)
    _down: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread = field(init=False)

    def __post_init__(self) -> None:
        self._injecting = self.inject
        self._thread = threading.Thread(target=self._run, daemon=True, name="soak-faults")

    def now(self) -> float:
        return time.monotonic() - self.started

    def start(self) -> FaultInjector:
        self._thread.start()
        return self

    def heal_all(self, timeout: float = 180.0) -> None:
        """Stop injecting and run every pending healing step now (the end of the fault phase)."""
        self._injecting = False
        self._heal_now.set()
        self._healed.wait(timeout)

    def freeze(self) -> None:
        """No new fault and no pending step any more (before the harness stops everything)."""
        self._injecting = False
        with self._lock:
            self._pending = []

    def close(self) -> None:
        """End the thread: only once everything it started is stopped (see `_run`)."""
        self._closed.set()
        self._thread.join(30)

    @property
    def last_fault_healed(self) -> float:
        return max((f.healed_at or f.at for f in self.faults), default=0.0)

    def _run(self) -> None:
        # Every restart runs on this thread, and a process spawned with PR_SET_PDEATHSIG dies
        # with the thread that forked it: so the thread lives until `close`, after the run.
        next_fault = self.now() + self.rng.uniform(*GAP_S)
        while not self._closed.wait(0.2):
            if self._heal_now.is_set() and not self._healed.is_set():
                with self._lock:
                    pending, self._pending = self._pending, []
                for _, _, step in sorted(pending, key=lambda p: p[:2]):
                    self._safely(step)
                self._healed.set()
            self._due()
            if self._injecting and self.now() >= next_fault:
                kind = self.rng.choices(list(KINDS), list(KINDS.values()))[0]
                self._safely(functools.partial(self._inject, kind))
                next_fault = self.now() + self.rng.uniform(*GAP_S)

    def _due(self) -> None:
        while True:
            with self._lock:
                if not self._pending or self._pending[0][0] > self.now():
                    return
                _, _, step = heapq.heappop(self._pending)
            self._safely(step)

    def _later(self, delay: float, step: Callable[[], None]) -> None:
        with self._lock:
            heapq.heappush(self._pending, (self.now() + delay, next(self._seq), step))

    def _safely(self, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception as exc:  # a fault that fails to apply or heal is reported, not fatal
            self.errors[type(exc).__name__] += 1
            log.warning("soak fault step failed: %r", exc)

    def _record(self, kind: str, target: str, duration: float = 0.0) -> Fault:
        fault = Fault(self.now(), kind, target, duration)
        self.faults.append(fault)
        self.sink_disruptions += self.sinks_disrupted(fault)
        return fault

    def sinks_disrupted(self, fault: Fault) -> int:
        """How many sinks ``fault`` can stop between an INTENT and its outcome, each leaving up
        to pool_size mails UNKNOWN: a sink's kill, a fault on its own Kafka or SMTP path, and a
        broker kill, which aborts every sink's open transaction at once (stop 37's CI counted a
        broker kill as one disruption, and its two sinks resent 5 mails between them)."""
        sinks = [name for name, i in self.instances.items() if i.component == "smtp-sink"]
        if fault.kind == "broker-kill":
            return len(sinks)
        return sum(fault.target == name or fault.target.startswith(f"{name}->") for name in sinks)

    def _inject(self, kind: str) -> None:
        rng = self.rng
        if kind == "kill":
            alive = sorted(n for n, i in self.instances.items() if i.alive)
            if not alive:
                return
            instance = self.instances[rng.choice(alive)]
            fault = self._record(kind, instance.name, rng.uniform(1, 5))
            instance.kill()
            self._later(fault.duration, lambda: self._restart(instance, fault))
        elif kind in self._down:
            return  # still down from the last one
        elif kind == "broker-kill":
            self._down.add(kind)
            fault = self._record(kind, "kafka", rng.uniform(2, 10))
            self.stack.kill_kafka()
            self._later(fault.duration, lambda: self._up(kind, self.stack.restart_kafka, fault))
        elif kind == "imap-restart":
            fault = self._record(kind, "dovecot")
            self.stack.restart_imap()
            fault.healed_at = self.now()
        elif kind in ("relay-421", "relay-451"):
            if self.relay.mode != "accept":
                return
            fault = self._record(kind, "relay", rng.uniform(10, 40))
            self.relay.mode = "421" if kind == "relay-421" else "451"
            self._later(fault.duration, lambda: self._relay_back(fault))
        elif kind == "registry-down":
            self._down.add(kind)
            fault = self._record(kind, "registry", rng.uniform(10, 40))
            self.stack.stop_registry()
            self._later(fault.duration, lambda: self._up(kind, self.stack.restart_registry, fault))
        else:
            self._network(kind)

    def _restart(self, instance: Instance, fault: Fault) -> None:
        if not instance.alive:
            instance.start()
        fault.healed_at = self.now()

    def _up(self, kind: str, restart: Callable[[], None], fault: Fault) -> None:
        restart()
        self._down.discard(kind)
        fault.healed_at = self.now()

    def _relay_back(self, fault: Fault) -> None:
        self.relay.mode = "accept"
        fault.healed_at = self.now()

    def _paths(self) -> list[tuple[str, TcpProxy]]:
        """(target name, proxy) of every fault-proxied path."""
        paths: list[tuple[str, TcpProxy]] = []
        for name, proxy in self.stack.kafka_proxies.items():
            paths.append((f"{name}->kafka", proxy))
        for name, proxy in self.stack.imap_proxies.items():
            paths.append((f"{name}->imap", proxy))
        for name, instance in self.instances.items():
            if instance.smtp_proxy is not None:
                paths.append((f"{name}->smtp", instance.smtp_proxy))
        return paths

    def _network(self, kind: str) -> None:
        rng = self.rng
        target, proxy = rng.choice(self._paths())
        if kind == "net-reset":
            fault = self._record(kind, target)
            proxy.cut()
            fault.healed_at = fault.at
            return
        duration = {
            "net-latency": rng.uniform(10, 30),
            "net-stall": rng.uniform(2, 8),
            "net-partition": rng.uniform(5, 30),
        }[kind]
        fault = self._record(kind, target, duration)
        if kind == "net-latency":
            proxy.delay = rng.uniform(0.05, 0.4)

            def heal() -> None:
                proxy.delay = 0.0
                fault.healed_at = self.now()

        else:
            proxy.stall()

            def heal() -> None:
                proxy.resume()
                if kind == "net-partition":
                    proxy.cut()
                fault.healed_at = self.now()

        self._later(duration, heal)

    def explains_exit(self, instance: Instance, within: float = EXIT_WINDOW_S) -> str | None:
        """The fault of the last ``within`` seconds that can make ``instance`` give up and exit
        (Kafka gone for longer than its timeouts, ...), or None: then the exit is a crash."""
        since = self.now() - within
        for fault in reversed(self.faults):
            if (fault.healed_at or self.now()) < since:
                continue
            shared = fault.kind in ("broker-kill", "registry-down")
            # its own path, or its own kill: the restart's start-up waits have limits too
            own = fault.target.startswith(f"{instance.name}->") or fault.target == instance.name
            imap = fault.kind == "imap-restart" and instance.component == "imap-source"
            relay = fault.kind.startswith("relay-") and instance.component == "smtp-sink"
            if shared or own or imap or relay:
                return f"{fault.kind} {fault.target} at {fault.at:.0f} s"
        return None

    def by_kind(self) -> dict[str, int]:
        return dict(Counter(f.kind for f in self.faults))
