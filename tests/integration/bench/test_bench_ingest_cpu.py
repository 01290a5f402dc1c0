"""The ingest benchmark's CPU figures count only this run's services.

It once summed every process on the machine whose command line named ``kafka.Kafka`` or
``dovecot``: on a shared machine, another run's broker that exited between two readings made the
broker's CPU per record negative. Decoys with those names must not move the figures.
"""

from __future__ import annotations

import subprocess
import sys
import time

from mailtap.bench.ingest import _cpu_groups
from mailtap.dev import DevServices, process

#: Burns CPU until killed; the trailing arguments only put the services' names on its command line.
_BURN = "while True:\n    pass\n"
DECOY_CPU_S = 1.0
WAIT_S = 120.0


def _decoy(name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", _BURN, name], start_new_session=True)


def test_other_processes_named_like_the_services_are_not_counted(services: DevServices) -> None:
    assert services.kafka.pid is not None, "needs a broker this run started (not an external one)"
    decoys = [_decoy("dovecot"), _decoy("kafka.Kafka")]
    try:
        deadline = time.monotonic() + WAIT_S
        while min(process.cpu_seconds(d.pid) for d in decoys) < DECOY_CPU_S:
            assert time.monotonic() < deadline, "the decoys did not get the CPU to burn"
            time.sleep(0.1)
        with_decoys = _cpu_groups(services)
        for decoy in decoys:
            decoy.kill()
            decoy.wait(WAIT_S)
        without = _cpu_groups(services)
    finally:
        for decoy in decoys:
            decoy.kill()
            decoy.wait(WAIT_S)
    # Counting the decoys, the services would "lose" their CPU when the decoys exit.
    assert without["dovecot"] >= with_decoys["dovecot"]
    assert without["kafka"] >= with_decoys["kafka"]
    assert with_decoys["kafka"] > 0 and with_decoys["dovecot"] > 0  # the services themselves
