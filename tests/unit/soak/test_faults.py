"""Which exits of an instance a fault explains: a fault that touched it within the window (the
broker, the registry, its own network path, Dovecot for a source, the relay for a sink); any
other exit is a crash."""

from __future__ import annotations

import random
import time
from pathlib import Path

from mailtap.soak.faults import EXIT_WINDOW_S, Fault, FaultInjector
from mailtap.soak.fleet import Instance


def injector(*faults: Fault) -> FaultInjector:
    # Only the fault list and the clock are used here: no stack, relay or thread.
    found = FaultInjector(random.Random(1), None, None, {}, time.monotonic() - 1000)  # type: ignore[arg-type]
    found.faults = list(faults)
    return found


SINK = Instance("smtp-sink-1", {}, Path("/nonexistent"), health_port=1)
SOURCE = Instance("imap-source-2", {}, Path("/nonexistent"), health_port=1)


def test_shared_faults_explain_any_exit_within_the_window() -> None:
    recent = injector(Fault(990.0, "broker-kill", "kafka", 5.0, 995.0))
    assert recent.explains_exit(SINK) == "broker-kill kafka at 990 s"
    old = injector(Fault(100.0, "broker-kill", "kafka", 5.0, 1000.0 - EXIT_WINDOW_S - 10))
    assert old.explains_exit(SINK) is None


def test_a_path_fault_explains_only_its_own_instance() -> None:
    faults = injector(Fault(990.0, "net-partition", "smtp-sink-1->kafka", 20.0, None))
    assert faults.explains_exit(SINK) is not None
    assert faults.explains_exit(SOURCE) is None


def test_server_faults_explain_their_clients_only() -> None:
    imap = injector(Fault(990.0, "imap-restart", "dovecot", 0.0, 990.0))
    assert imap.explains_exit(SOURCE) is not None
    assert imap.explains_exit(SINK) is None
    relay = injector(Fault(990.0, "relay-451", "relay", 30.0, None))
    assert relay.explains_exit(SINK) is not None
    assert relay.explains_exit(SOURCE) is None


def test_its_own_kill_explains_an_exit_while_restarting() -> None:
    killed = injector(Fault(990.0, "kill", "imap-source-2", 3.0, 993.0))
    assert killed.explains_exit(SOURCE) == "kill imap-source-2 at 990 s"
    assert killed.explains_exit(SINK) is None


def test_a_broker_kill_disrupts_every_sink_and_a_path_fault_its_own() -> None:
    """The too-many-copies bound is pool_size per disrupted sink: a broker kill aborts every
    sink's open transaction, so it counts once per sink, not once (stop 37's CI: two sinks
    resent 5 mails after one broker kill, over a bound of 4 x 1)."""
    sinks = {
        n: Instance(n, {}, Path("/nonexistent"), health_port=1)
        for n in ("smtp-sink-1", "smtp-sink-2")
    }
    fleet = injector()
    fleet.instances = {**sinks, SOURCE.name: SOURCE}
    assert fleet.sinks_disrupted(Fault(1.0, "broker-kill", "kafka")) == 2
    assert fleet.sinks_disrupted(Fault(1.0, "net-stall", "smtp-sink-2->kafka")) == 1
    assert fleet.sinks_disrupted(Fault(1.0, "net-reset", "smtp-sink-1->smtp")) == 1
    assert fleet.sinks_disrupted(Fault(1.0, "kill", "smtp-sink-1")) == 1
    assert fleet.sinks_disrupted(Fault(1.0, "kill", "imap-source-2")) == 0
    assert fleet.sinks_disrupted(Fault(1.0, "net-partition", "imap-source-2->kafka")) == 0
    assert fleet.sinks_disrupted(Fault(1.0, "imap-restart", "dovecot")) == 0
