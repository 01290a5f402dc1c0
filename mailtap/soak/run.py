"""``mailtap soak``: the fleet under seeded random faults, judged by the independent verifier.

1. Start a private service set (`mailtap.soak.stack`): Kafka with one proxied listener per
   component instance, the registry, Dovecot, the relay; M mailboxes (folders INBOX and Work)
   and a bounce mailbox; the topics.
2. Start 3 imap-source, 2 streams and 2 smtp-sink instances and wait until each is healthy.
3. For ``--minutes``: the seeded workload, a fault every 10-60 s, a sample every 5 s (rates,
   lag, RSS, fds), the verifier's continuous rules every 30 s, a progress line every 30 s.
4. Heal every fault; measure how long until the lag is under 5 s and every instance is healthy
   (at most `RECOVERY_LIMIT_S`); stop the workload; wait until the final rules hold or
   `DRAIN_S` passes; stop everything and look for orphaned processes.
5. Write ``soak.json`` and ``soak.png`` to ``--report``; the last line printed is the verdict.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mailtap.dev import scenario
from mailtap.dev.layout import REPO_ROOT
from mailtap.dev.process import free_port, group_members
from mailtap.dev.tcp_proxy import TcpProxy
from mailtap.soak import report
from mailtap.soak.faults import FaultInjector
from mailtap.soak.fleet import INSTANCES, SINKS, Instance
from mailtap.soak.monitor import LagProbe, Sample, health_and_owned, health_of, sample_fleet
from mailtap.soak.relay import SoakRelay
from mailtap.soak.secured import make_stack
from mailtap.soak.stack import HOST, Stack
from mailtap.soak.verifier import Decoder, Ledger, TopicReader, Violation, read_server
from mailtap.soak.workload import PASSWORD, WATCHED, Mailbox, Workload

SAMPLE_S = 5.0
PROGRESS_S = 30.0
STARTUP_LIMIT_S = 600.0
RECOVERY_LAG_S = 5.0
RECOVERY_LIMIT_S = 60.0
DRAIN_S = 240.0
POOL_SIZE = 4
STREAMS_APP = "soak-streams"
SINK_GROUP = "soak-sink"
BOUNCE_ACCOUNT = "soak-bounces"
TOPICS = {
    "mail.events": "MailEvent",
    "mail.commands": "ReplyCommand",
    "mail.delivery": "DeliveryEvent",
}


@dataclass
class SoakOptions:
    minutes: float = 60.0
    seed: int = 1
    mailboxes: int = 100
    report_dir: Path | None = None
    state_dir: Path | None = None
    #: seconds between workload steps
    step_seconds: float = 1.0
    keep_state: bool = False
    #: False: a baseline without faults (what the fleet's RSS does under the workload alone)
    faults: bool = True
    #: None: a PLAINTEXT broker; "scram" or "mtls": a secured one (`mailtap.soak.secured`)
    secure: str | None = None


@dataclass
class SoakRun:
    options: SoakOptions
    say: Callable[[str], None]
    started: float = field(default_factory=time.monotonic)
    samples: list[Sample] = field(default_factory=list)
    violations: dict[tuple[str, str], tuple[float, Violation]] = field(default_factory=dict)
    #: instances that exited by themselves: (at, instance, status, whether with a traceback)
    exits: list[dict[str, Any]] = field(default_factory=list)
    relay: SoakRelay | None = None
    relay_seen: int = 0

    def t(self) -> float:
        return time.monotonic() - self.started

    def supervise(
        self, instances: dict[str, Instance], injector: FaultInjector | None = None
    ) -> None:
        """Restart what exited by itself, as an orchestrator would. Reported, not violations:
        an exit soon after a fault that touched the instance, and any exit during the fleet's
        first start, before any fault (a start-up wait ran out, as the README says components
        do on a cluster that does not answer in time). Any other exit is a crash."""
        for name, instance in instances.items():
            status = instance.exited_by_itself()
            if status is None:
                continue
            cause = injector.explains_exit(instance) if injector else None
            last = [line for line in instance.log_tail(40).splitlines() if line.strip()][-1:]
            if cause is None and injector is None:
                # No fault yet: a start-up wait that ran out on a loaded machine, restarted.
                cause = "the first start-up"
            self.exits.append(
                {
                    "at_s": round(self.t(), 1),
                    "instance": name,
                    "status": status,
                    "after_fault": cause,
                    "last_line": " ".join(last)[:300],
                }
            )
            self.say(f"{name} exited by itself (status {status}, after {cause}); restarting it")
            if cause is None:
                self.found([Violation("crash", f"{name}@{self.t():.0f}s", " ".join(last))])
            instance.start()

    def feed_relay(self, ledger: Ledger) -> None:
        """What the relay accepted since the last call, to the verifier (copies, threading)."""
        assert self.relay is not None
        for mail in self.relay.snapshot(self.relay_seen):
            self.relay_seen += 1
            ledger.relayed_mail(mail.message_id, mail.in_reply_to, mail.references)

    def found(self, violations: list[Violation]) -> None:
        for v in violations:
            if (v.rule, v.subject) not in self.violations:
                self.violations[(v.rule, v.subject)] = (self.t(), v)
                self.say(f"VIOLATION {v.rule} {v.subject}: {v.detail}")


def run_soak(options: SoakOptions, say: Callable[[str], None]) -> tuple[bool, dict[str, Any]]:
    """Run the soak; returns (passed, the report document)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    state = options.state_dir or REPO_ROOT / ".state" / "soak" / f"{stamp}-seed{options.seed}"
    state = state.resolve()
    state.mkdir(parents=True, exist_ok=True)
    run = SoakRun(options, say)
    stack = make_stack(state, INSTANCES, options.secure)
    relay = SoakRelay(HOST, free_port()).start()
    run.relay = relay
    instances: dict[str, Instance] = {}
    reader: TopicReader | None = None
    workload: Workload | None = None
    injector: FaultInjector | None = None
    lag: LagProbe | None = None
    document: dict[str, Any] = {
        "seed": options.seed,
        "state_dir": str(state),
        "secure": options.secure,
    }
    ledger = Ledger()
    try:
        say(
            f"soak seed {options.seed}: {options.mailboxes} mailboxes, {options.minutes} min, state {state}"
        )
        stack.start()
        say(f"services up: kafka {stack.bootstrap}, dovecot {stack.imap_port}, relay {relay.port}")
        boxes = [
            Mailbox(f"soak{i}", f"soak{i}@example.com") for i in range(1, options.mailboxes + 1)
        ]
        bounce = Mailbox(BOUNCE_ACCOUNT, f"{BOUNCE_ACCOUNT}@example.com")
        stack.add_users([(b.username, PASSWORD) for b in [*boxes, bounce]])
        workload = Workload(
            HOST,
            stack.imap_port,
            boxes,
            bounce,
            relay,
            random.Random(options.seed),
            ledger.appended,
            options.step_seconds,
        )
        workload.prepare()
        _ensure_topics(stack, state)
        reader = TopicReader(
            stack.bootstrap, TOPICS, ledger, Decoder(REPO_ROOT / "schemas")
        ).start()
        for name in INSTANCES:
            instances[name] = _instance(name, stack, relay, [*boxes, bounce], state)
        if options.secure:
            held = stack.grant_acls({n: i.config for n, i in instances.items()})
            document["acls_held"] = held
            say(f"ACLs held: {', '.join(f'{p} {len(b)}' for p, b in held.items())}")
        for instance in instances.values():
            instance.start()
        _wait_healthy(run, instances)
        lag = LagProbe(stack.bootstrap, {STREAMS_APP: "mail.events", SINK_GROUP: "mail.commands"})
        run.started = time.monotonic()  # the soak's clock starts with the workload
        workload.start()
        injector = FaultInjector(
            random.Random(options.seed * 7919 + 1),
            stack,
            relay,
            instances,
            run.started,
            inject=options.faults,
        )
        injector.start()
        _soak_phase(run, options.minutes * 60, instances, ledger, lag, injector)
        injector.heal_all()
        healed_at = run.t()
        say(f"faults over ({len(injector.faults)} injected); healed at {healed_at:.0f} s")
        recovery = _recovery(run, instances, lag, injector)
        document["recovery_s"] = recovery
        if recovery is None or recovery > RECOVERY_LIMIT_S:
            run.found(
                [
                    Violation(
                        "slow-recovery",
                        "fleet",
                        f"lag < {RECOVERY_LAG_S} s and all healthy took {recovery} s "
                        f"(limit {RECOVERY_LIMIT_S} s)",
                    )
                ]
            )
        workload.stop()
        final = _drain(run, ledger, stack, [*boxes, bounce], injector, instances)
        run.found(final)
        document["unhealthy_at_end"] = [n for n, ok in health_of(instances).items() if not ok]
    except Exception as exc:  # the run could not go on: a verdict and a report all the same
        run.found([Violation("harness-error", type(exc).__name__, str(exc)[:2000])])
    finally:
        if injector is not None:
            injector.freeze()
        if workload is not None:
            workload.stop()
        for instance in instances.values():
            instance.stop()
        if reader is not None:
            reader.stop()
        if lag is not None:
            lag.close()
        relay.stop()
        stack.stop()
        for instance in instances.values():
            if instance.smtp_proxy is not None:
                instance.smtp_proxy.close()
        if injector is not None:
            injector.close()
    for principal, refused in stack.denied().items():
        run.found(
            [
                Violation(
                    "acl-denied",
                    f"User:{principal}",
                    f"{len(refused)} refused, first: {refused[0][:300]}",
                )
            ]
        )
    orphans = _orphans(state, stack, instances)
    if orphans:
        run.found([Violation("orphan", "process", f"left running: {orphans}")])
    if reader is not None and reader.decode_errors:
        run.found([Violation("undecodable", "topic", "; ".join(reader.decode_errors[:5]))])
    leaks = report.leak_figures(run.samples)
    for entry in leaks["leaks"]:
        run.found(
            [
                Violation(
                    "leak",
                    f"{entry['instance']}#{entry['life']}",
                    f"RSS {entry['rss_mb_per_min']} MB/min, fds {entry['fds_per_min']}/min "
                    f"over {entry['window_s']} s",
                )
            ]
        )
    document.update(
        _figures(run, ledger, workload, injector, instances, leaks, relay),
    )
    passed = not run.violations
    document["verdict"] = "PASS" if passed else "FAIL"
    if options.report_dir is not None:
        report.write_json(options.report_dir / "soak.json", document)
        why_not = report.plot(
            options.report_dir / "soak.png",
            run.samples,
            injector.faults if injector else [],
            report.title(options.seed, options.mailboxes, options.secure),
        )
        if why_not:
            say(f"no plot: {why_not}")
        say(f"report in {options.report_dir}")
    if not options.keep_state:
        shutil.rmtree(state / "kafka" / "data", ignore_errors=True)
    return passed, document


# --- set-up -----------------------------------------------------------------------------------


def _base_config(stack: Stack, state: Path) -> dict[str, Any]:
    return {
        "kafka": {
            "bootstrap_servers": stack.bootstrap,
            "schema_registry_url": stack.registry_url,
            "partitions": 3,
        },
        "claim_check": {"url": (state / "claims").as_uri()},
    }


def _ensure_topics(stack: Stack, state: Path) -> None:
    from connectors.core.config import load_config
    from connectors.core.kafka.topics import ensure_topic_specs, ensure_topics
    from connectors.imap.indexlog import topic_spec as index_topic_spec

    path = state / "admin.yaml"
    path.write_text(yaml.safe_dump(_base_config(stack, state)))
    cfg = load_config(path)
    ensure_topics(cfg.kafka, ["5s", "20s"])
    ensure_topic_specs(cfg.kafka, [index_topic_spec(cfg.kafka)])


def _instance(
    name: str, stack: Stack, relay: SoakRelay, boxes: list[Mailbox], state: Path
) -> Instance:
    imap_host, imap_port = stack.imap_address(name)
    smtp_proxy = TcpProxy(HOST, relay.port).start() if name in SINKS else None
    streams = scenario.streams_section(STREAMS_APP)
    streams.update(
        data_dir=str(state / "streams" / name),
        rate_limit={"max_replies": 1_000_000, "window_seconds": 3600, "exempt_recipients": ["*"]},
    )
    config = {
        **_base_config(stack, state),
        "imap": {
            "group": {"id": "soak-sources", "session_timeout_seconds": 10},
            "catchup_poll_seconds": 60,
            "accounts": [
                {
                    "name": box.account,
                    "host": imap_host,
                    "port": imap_port,
                    "security": "plain",
                    "username": box.username,
                    "password": PASSWORD,
                    "folders": list(WATCHED),
                    "start": "all",
                }
                for box in boxes
            ],
        },
        "streams": streams,
        "smtp": {
            "host": HOST,
            "port": smtp_proxy.port if smtp_proxy else relay.port,
            "security": "plain",
            "from_address": "mailtap@example.com",
            "instance_id": name,
            "group_id": SINK_GROUP,
            "bounce_accounts": [BOUNCE_ACCOUNT],
            "retry_tiers": ["5s", "20s"],
            "max_lifetime": "30m",
            "max_attempts": 1000,
            "pool_size": POOL_SIZE,
        },
    }
    config["kafka"] = {**config["kafka"], **stack.kafka_client(name)}
    instance = Instance(name, config, state)
    instance.smtp_proxy = smtp_proxy
    return instance


def _wait_healthy(run: SoakRun, instances: dict[str, Instance]) -> None:
    deadline = time.monotonic() + STARTUP_LIMIT_S
    while time.monotonic() < deadline:
        run.supervise(instances)
        health = health_of(instances)
        if all(health.values()):
            run.say(f"all {len(instances)} instances healthy after {run.t():.0f} s")
            return
        time.sleep(2)
    sick = [n for n, ok in health_of(instances).items() if not ok]
    raise RuntimeError(f"not healthy after {STARTUP_LIMIT_S:.0f} s: {sick}")


# --- phases -----------------------------------------------------------------------------------


def _sample(
    run: SoakRun,
    instances: dict[str, Instance],
    ledger: Ledger,
    lag: LagProbe,
    with_health: bool,
) -> Sample:
    run.feed_relay(ledger)
    rss, fds = sample_fleet(instances)
    healthy, owned = health_and_owned(instances)
    figures = ledger.figures()
    sample = Sample(
        at=run.t(),
        events=figures["events_read"],
        commands=figures["commands"],
        deliveries=sum(len(v) for v in ledger.deliveries.values()),
        lag_s=lag.seconds(),
        rss=rss,
        fds=fds,
        lives={n: i.lives for n, i in instances.items()},
        healthy=healthy if with_health else {},
        owned=owned,
    )
    run.samples.append(sample)
    return sample


def _soak_phase(
    run: SoakRun,
    seconds: float,
    instances: dict[str, Instance],
    ledger: Ledger,
    lag: LagProbe,
    injector: FaultInjector,
) -> None:
    next_progress = PROGRESS_S
    while run.t() < seconds:
        time.sleep(SAMPLE_S)
        run.supervise(instances, injector)
        with_progress = run.t() >= next_progress
        sample = _sample(run, instances, ledger, lag, with_health=with_progress)
        if with_progress:
            next_progress += PROGRESS_S
            run.found(ledger.continuous(POOL_SIZE, -1))
            down = [n for n, ok in sample.healthy.items() if not ok]
            run.say(
                f"{run.t() / 60:5.1f}/{seconds / 60:.0f} min  events {sample.events}  "
                f"commands {sample.commands}  lag {_fmt(sample.lag_s)} s {_lags(lag)}  "
                f"faults {len(injector.faults)} {injector.by_kind()}  "
                f"unhealthy {down or '-'}  violations {len(run.violations)}"
            )


def _recovery(
    run: SoakRun, instances: dict[str, Instance], lag: LagProbe, injector: FaultInjector
) -> float | None:
    """Seconds from the healing until lag < RECOVERY_LAG_S and every instance is healthy."""
    begin = run.t()
    behind, health = None, {}
    while run.t() - begin < RECOVERY_LIMIT_S * 2:
        run.supervise(instances, injector)
        behind = lag.seconds()
        health = health_of(instances)
        if behind is not None and behind < RECOVERY_LAG_S and all(health.values()):
            took = run.t() - begin
            run.say(f"recovered in {took:.1f} s (lag {behind:.1f} s, all healthy)")
            return round(took, 1)
        time.sleep(1)
    run.say(f"not recovered after {RECOVERY_LIMIT_S * 2:.0f} s: lag {behind}, health {health}")
    return None


def _drain(
    run: SoakRun,
    ledger: Ledger,
    stack: Stack,
    boxes: list[Mailbox],
    injector: FaultInjector,
    instances: dict[str, Instance],
) -> list[Violation]:
    """The final rules, retried until they hold or DRAIN_S passes (retries and the last
    source syncs need time); the last answer counts."""
    accounts = {b.account: (b.username, PASSWORD) for b in boxes}
    deadline = run.t() + DRAIN_S
    while True:
        run.supervise(instances, injector)
        run.feed_relay(ledger)
        server = read_server(HOST, stack.imap_port, accounts, WATCHED)
        found = ledger.final(server, POOL_SIZE, injector.sink_disruptions)
        if not found or run.t() > deadline:
            run.say(f"final check: {len(server)} mails on the server, {len(found)} violations")
            return found
        run.say(f"final check: {len(found)} open ({found[0].rule} {found[0].subject}); waiting")
        time.sleep(10)


def _orphans(state: Path, stack: Stack, instances: dict[str, Instance]) -> list[str]:
    """Processes still running that belong to this run: in a group it started, or with the
    run's state directory on their command line."""
    left: list[str] = []
    groups = set(stack.started_groups)
    groups |= {i.proc.pid for i in instances.values() if i.proc is not None}
    for pgid in groups:
        left += [f"{pid} (group {pgid})" for pid in group_members(pgid)]
    marker = str(state).encode()
    ours = _ancestors()  # the harness and whatever started it (a `timeout`, a shell)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in ours:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if marker in cmdline and stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
            command = cmdline.replace(b"\0", b" ")[:120].decode(errors="replace")
            left.append(f"{entry.name}: {command}")
    return sorted(set(left))


def _ancestors() -> set[int]:
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return found


# --- figures ----------------------------------------------------------------------------------


def _figures(
    run: SoakRun,
    ledger: Ledger,
    workload: Workload | None,
    injector: FaultInjector | None,
    instances: dict[str, Instance],
    leaks: dict[str, Any],
    relay: SoakRelay,
) -> dict[str, Any]:
    lags = [s.lag_s for s in run.samples if s.lag_s is not None]
    return {
        "minutes": run.options.minutes,
        "mailboxes": run.options.mailboxes,
        "seconds_run": round(run.t()),
        "workload": dict(workload.counts) if workload else {},
        "workload_errors": dict(workload.errors) if workload else {},
        "mails_appended": sum(len(v) for v in ledger.known.values()),
        "verifier": ledger.figures(),
        "faults_by_kind": injector.by_kind() if injector else {},
        "faults": [f.to_json() for f in injector.faults] if injector else [],
        "fault_errors": dict(injector.errors) if injector else {},
        "sink_disruptions": injector.sink_disruptions if injector else 0,
        "last_fault_healed_at_s": round(injector.last_fault_healed, 1) if injector else None,
        "relay_refusals": relay.refused,
        "restarts": {n: i.lives - 1 for n, i in instances.items()},
        "exits_by_themselves": run.exits,
        "lag_s_max": round(max(lags), 1) if lags else None,
        "leaks": leaks,
        "violations": [
            {"at_s": round(at, 1), **v.to_json()}
            for at, v in sorted(run.violations.values(), key=lambda x: x[0])
        ],
        "samples": [s.to_json() for s in run.samples],
    }


def _lags(lag: LagProbe) -> str:
    return " ".join(f"{g}={v:.0f}" for g, v in lag.by_group.items())


def _fmt(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f}"
