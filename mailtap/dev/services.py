"""Bring the local services up and down together, and describe them.

``up(state_dir)`` starts Kafka (unless ``MAILTAP_KAFKA_BOOTSTRAP`` names a cluster), the schema
registry (Apicurio, `mailtap.dev.registry`; ``MAILTAP_DEV_REGISTRY=off`` leaves it out and the
config registry-less), Dovecot and the recording SMTP server, waits until each answers, writes ``<state>/state.json`` (pids with
their start times, connection details) and a ready-to-use ``<state>/mailtap.yaml``, and returns a
`DevServices`. ``down(state_dir)`` stops exactly the process groups recorded in the state file.

``up(state_dir, secure=True)`` starts the secured broker of `mailtap.dev.secure` instead (SASL_SSL,
mTLS and OAUTHBEARER listeners, an authorizer, the dev OAuth server) and writes a config per
component and mechanism under ``<state>/secure/``; ``<state>/mailtap.yaml`` then uses the
PLAINTEXT admin listener (a super user), for ``topics ensure`` and the demo.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from connectors.core.config import ENV_KAFKA_BOOTSTRAP, env_bootstrap_servers
from mailtap.dev import (
    dovecot,
    imapservers,
    kafka,
    process,
    received,
    registry,
    scenario,
    smtp_server,
)
from mailtap.dev import secure as secure_kafka
from mailtap.dev.errors import ServiceStartError
from mailtap.dev.layout import DEFAULT_STATE_DIR, ENV_DEV_REGISTRY

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
STATE_FILE = "state.json"
CONFIG_FILE = "mailtap.yaml"
#: The account the written mailtap config reads from.
CONFIG_ACCOUNT = "demo@example.com"
SMTP_FROM_ADDRESS = "mailtap@example.com"
SMTP_START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Account:
    username: str
    password: str


@dataclass(frozen=True)
class KafkaInfo:
    bootstrap_servers: str
    #: True when ``MAILTAP_KAFKA_BOOTSTRAP`` named the cluster: we neither started nor stop it.
    external: bool
    pid: int | None
    log_path: Path | None


@dataclass(frozen=True)
class ImapInfo:
    host: str
    port: int
    accounts: tuple[Account, ...]
    pid: int
    log_path: Path
    config_path: Path
    passwd_file: Path
    mail_dir: Path
    #: Which server (`mailtap.dev.imapservers.KINDS`); state files from before it are Dovecot's.
    kind: str = "dovecot"

    @property
    def root(self) -> Path:
        """Where the server keeps its config, accounts and mail."""
        return self.passwd_file.parent

    def add_users(self, accounts: list[tuple[str, str]]) -> None:
        """Create (or replace) accounts; each can log in when this returns."""
        imapservers.add_users(self.kind, self.root, accounts)


@dataclass(frozen=True)
class SmtpInfo:
    host: str
    port: int
    received_dir: Path
    pid: int
    log_path: Path


@dataclass(frozen=True)
class RegistryInfo:
    url: str  # Confluent-compatible API, the config's kafka.schema_registry_url
    pid: int
    log_path: Path


@dataclass(frozen=True)
class DevServices:
    """Connection details of running local services, plus helpers to drive them in tests."""

    state_dir: Path
    config_path: Path
    claims_dir: Path
    kafka: KafkaInfo
    imap: ImapInfo
    smtp: SmtpInfo
    #: None when ``MAILTAP_DEV_REGISTRY=off`` (or a state dir from before the registry).
    registry: RegistryInfo | None = None
    #: The secured listeners, principals and OAuth server (``up(secure=True)``), else None.
    secure: secure_kafka.SecureKafka | None = None
    started_at: float = field(default=0.0, compare=False)

    @property
    def bootstrap_servers(self) -> str:
        return self.kafka.bootstrap_servers

    @property
    def pids(self) -> list[int]:
        """Process (group) ids this set started; `down` stops exactly these."""
        own = [self.imap.pid, self.smtp.pid]
        if self.registry is not None:
            own.append(self.registry.pid)
        if self.secure is not None:
            own.append(self.secure.oauth_pid)
        return [self.kafka.pid, *own] if self.kafka.pid is not None else own

    def add_user(self, username: str, password: str = dovecot.DEFAULT_PASSWORD) -> Account:
        """Create an IMAP account at runtime (usable at once), on whichever server runs."""
        self.imap.add_users([(username, password)])
        return Account(username, password)

    def doveadm(self, *args: str, check: bool = True) -> dovecot.DoveadmResult:
        """Run doveadm against this Dovecot, e.g. ``doveadm("expunge", "-u", u, "mailbox",
        "INBOX", "all")`` or ``doveadm("mailbox", "update", "-u", u, "--uid-validity", "9",
        "INBOX")``."""
        if not self.imap.kind.startswith("dovecot"):
            raise RuntimeError(f"doveadm needs Dovecot; these services run {self.imap.kind}")
        return dovecot.doveadm(self.imap.config_path, *args, check=check)

    def received_messages(self) -> list[received.ReceivedMessage]:
        """Messages the SMTP server accepted so far, oldest first."""
        return received.received_messages(self.smtp.received_dir)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("started_at")
        data["secure"] = None if self.secure is None else self.secure.to_json()
        data["imap"]["accounts"] = [asdict(a) for a in self.imap.accounts]
        return json.loads(json.dumps(data, default=str))  # type: ignore[no-any-return]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DevServices:
        k, i, s, r = data["kafka"], data["imap"], data["smtp"], data.get("registry")
        secured = data.get("secure")
        return cls(
            state_dir=Path(data["state_dir"]),
            config_path=Path(data["config_path"]),
            claims_dir=Path(data["claims_dir"]),
            kafka=KafkaInfo(
                bootstrap_servers=k["bootstrap_servers"],
                external=k["external"],
                pid=k["pid"],
                log_path=Path(k["log_path"]) if k["log_path"] else None,
            ),
            imap=ImapInfo(
                host=i["host"],
                port=i["port"],
                accounts=tuple(Account(**a) for a in i["accounts"]),
                pid=i["pid"],
                log_path=Path(i["log_path"]),
                config_path=Path(i["config_path"]),
                passwd_file=Path(i["passwd_file"]),
                mail_dir=Path(i["mail_dir"]),
                kind=i.get("kind", "dovecot"),
            ),
            smtp=SmtpInfo(
                host=s["host"],
                port=s["port"],
                received_dir=Path(s["received_dir"]),
                pid=s["pid"],
                log_path=Path(s["log_path"]),
            ),
            registry=None
            if r is None
            else RegistryInfo(url=r["url"], pid=r["pid"], log_path=Path(r["log_path"])),
            secure=None if secured is None else secure_kafka.SecureKafka.from_json(secured),
            started_at=data.get("started_at", 0.0),
        )


# --- state file -------------------------------------------------------------------------------


def _state_path(state_dir: Path) -> Path:
    return state_dir / STATE_FILE


def _write_state(state_dir: Path, state: dict[str, Any]) -> None:
    tmp = state_dir / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(state, indent=2, default=str))
    tmp.chmod(0o600)  # a secured set records its principals' credentials here
    tmp.replace(_state_path(state_dir))


def _read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(_state_path(state_dir).read_text())
    except FileNotFoundError:
        return None
    return data


def _remembered_ports(state_dir: Path) -> dict[str, int]:
    """Ports of the previous run, reused when still free so configs and Kafka data stay valid."""
    try:
        ports: dict[str, int] = json.loads((state_dir / "ports.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return ports


def _registry_port(state_dir: Path) -> int:
    """The registry's port of the previous run when still free, else a new one (remembered
    apart from the others: a state dir from before the registry keeps its Kafka ports)."""
    ports = _remembered_ports(state_dir)
    if "registry" in ports and process.port_is_free(ports["registry"]):
        return ports["registry"]
    taken = set(ports.values())
    port = process.free_port(HOST)
    while port in taken:
        port = process.free_port(HOST)
    (state_dir / "ports.json").write_text(json.dumps({**ports, "registry": port}))
    return port


def registry_wanted() -> bool:
    """False when ``MAILTAP_DEV_REGISTRY=off``: the services and config go without a registry
    (single-object encoding), as for users who run none."""
    return os.environ.get(ENV_DEV_REGISTRY, "on").strip().lower() not in ("off", "0", "no", "false")


def _pick_ports(state_dir: Path, names: list[str]) -> dict[str, int]:
    previous = _remembered_ports(state_dir)
    if previous and all(n in previous and process.port_is_free(previous[n]) for n in names):
        return {n: previous[n] for n in names}
    ports = dict(zip(names, process.free_ports(len(names), HOST), strict=True))
    kept = {n: p for n, p in previous.items() if n not in names and p not in ports.values()}
    (state_dir / "ports.json").write_text(json.dumps({**kept, **ports}))
    return ports


# --- up / down / status -----------------------------------------------------------------------


def resolve_state_dir(state_dir: Path | str | None) -> Path:
    return Path(state_dir).resolve() if state_dir else DEFAULT_STATE_DIR


def _recorded(state: dict[str, Any]) -> list[tuple[int, int | None]]:
    """(pid, start time) of every process group the state file records."""
    return [(int(p["pid"]), p.get("start_time")) for p in state.get("processes", [])]


def status(state_dir: Path | str | None = None) -> DevServices | None:
    """The running services of ``state_dir`` when every one of them answers, else None."""
    state = _read_state(resolve_state_dir(state_dir))
    if state is None or "services" not in state:
        return None
    if any(process.start_time(pid) != started for pid, started in _recorded(state)):
        return None  # one has exited, or its pid now belongs to another process
    info = DevServices.from_json(state["services"])
    return info if healthy(info) else None


def healthy(info: DevServices) -> bool:
    """Every process of ``info`` is alive and every service answers."""
    if not all(process.is_alive(pid) for pid in info.pids):
        return False
    try:
        kafka.probe(info.kafka.bootstrap_servers)
        account = info.imap.accounts[0]
        dovecot.probe(info.imap.host, info.imap.port, account.username, account.password)
        smtp_probe(info.smtp.host, info.smtp.port)
        if info.registry is not None:
            registry.probe(info.registry.url)
        if info.secure is not None:
            secure_kafka.probe_jwks(info.secure.jwks_url)
    except Exception:
        return False
    return True


def up(
    state_dir: Path | str | None = None, *, secure: bool = False, imap: str = "dovecot"
) -> DevServices:
    """Start the services (or return the running ones when ``state_dir``'s set is healthy,
    secured or not as asked, and runs the IMAP server ``imap``, one of
    `mailtap.dev.imapservers.KINDS`)."""
    imapservers.check_kind(imap)
    root = resolve_state_dir(state_dir)
    running = status(root)
    if running is not None and (running.secure is not None) == secure and running.imap.kind == imap:
        log.info("services in %s already up", root)
        return running
    down(root)  # a partial or dead earlier set: clear it before starting afresh
    root.mkdir(parents=True, exist_ok=True)
    started: dict[str, Any] = {"processes": []}
    _write_state(root, started)
    try:
        info = _start_all(root, started, secure, imap)
    except BaseException:
        down(root)
        raise
    started["services"] = {**info.to_json(), "started_at": time.time()}
    _write_state(root, started)
    write_config(info)
    if info.secure is not None:
        # Exactly what `mailtap acls` prints for each component's written config.
        from mailtap.dev.secure_acls import grant_component_acls

        grant_component_acls(info.secure)
    return info


def _start_all(root: Path, started: dict[str, Any], secured: bool, imap_kind: str) -> DevServices:
    # A cluster that is already running (MAILTAP_KAFKA_BOOTSTRAP or its alias) instead of ours.
    external = env_bootstrap_servers(os.environ)
    if external and secured:
        raise ServiceStartError(
            f"--secure starts a broker of its own: unset {ENV_KAFKA_BOOTSTRAP} ({external})"
        )
    names = ["imap", "smtp"] if external else ["kafka", "kafka_controller", "imap", "smtp"]
    if secured:
        names += secure_kafka.PORT_NAMES
    ports = _pick_ports(root, names)

    def record(pid: int) -> None:
        started["processes"].append({"pid": pid, "start_time": process.start_time(pid)})
        _write_state(root, started)

    # Kafka's JVM takes seconds; start it first and wait for it last.
    kafka_layout = kafka.KafkaLayout(root / "kafka")
    kafka_pid: int | None = None
    secured_kafka: secure_kafka.SecureKafka | None = None
    if external:
        bootstrap = external
    elif secured:
        secured_kafka, kafka_pid, kafka_layout = secure_kafka.launch(
            root / "secure", HOST, ports, record
        )
        bootstrap = secured_kafka.admin_bootstrap
    else:
        bootstrap = f"{HOST}:{ports['kafka']}"
        kafka.render(kafka_layout, HOST, ports["kafka"], ports["kafka_controller"])
        kafka.prepare_storage(kafka_layout, ports["kafka"], ports["kafka_controller"])
        kafka_pid = kafka.start(kafka_layout)
        record(kafka_pid)

    # The registry stores its schemas in a file of its own (not in Kafka), so it starts next to
    # Kafka; its JVM is the slowest to answer (~7-20 s), so it is waited for last.
    registry_dir = root / "registry"
    schema_registry: registry.RunningRegistry | None = None
    if registry_wanted():
        if not registry.is_installed():
            raise ServiceStartError(
                f"registry: not built ({registry.run_jar()} is missing): run `make registry`, "
                f"or set {ENV_DEV_REGISTRY}=off for services and a config without a schema "
                "registry (single-object encoding)"
            )
        schema_registry = registry.launch(registry_dir, HOST, _registry_port(root))
        record(schema_registry.pid)

    imap = imapservers.launch(imap_kind, root, HOST, ports["imap"])
    record(imap.pid)

    smtp_root = root / "smtp"
    received_dir = smtp_root / "received"
    smtp_log = smtp_root / "smtp.log"
    smtp_pid = process.spawn(
        [
            sys.executable,
            "-m",
            smtp_server.__name__,
            "--host",
            HOST,
            "--port",
            str(ports["smtp"]),
            "--folder",
            str(received_dir),
        ],
        smtp_log,
    )
    record(smtp_pid)

    t0 = time.monotonic()
    imapservers.wait_ready(imap, HOST, ports["imap"])
    log.info(
        "%s ready on %s:%d after %.2f s", imap_kind, HOST, ports["imap"], time.monotonic() - t0
    )
    process.wait_until_ready(
        "smtp",
        smtp_pid,
        lambda: smtp_probe(HOST, ports["smtp"]),
        [smtp_log],
        SMTP_START_TIMEOUT_S,
    )
    log.info("smtp ready on %s:%d after %.2f s", HOST, ports["smtp"], time.monotonic() - t0)
    if kafka_pid is None:
        process.wait_until_ready(
            f"kafka ({ENV_KAFKA_BOOTSTRAP})",
            None,
            lambda: kafka.probe(bootstrap),
            [],
            kafka.START_TIMEOUT_S,
            interval=0.5,
        )
    else:
        kafka.wait_ready(kafka_layout, kafka_pid, bootstrap)
        # Ours is new: its coordinators now, while the registry starts, not in the first
        # component's start-up (an external cluster has them).
        kafka.make_coordinators(bootstrap)
    log.info("kafka ready at %s after %.2f s", bootstrap, time.monotonic() - t0)
    if schema_registry is not None:
        registry.wait_ready(registry_dir, schema_registry)
        log.info("registry ready at %s after %.2f s", schema_registry.url, time.monotonic() - t0)

    return DevServices(
        state_dir=root,
        config_path=root / CONFIG_FILE,
        claims_dir=root / "claims",
        kafka=KafkaInfo(
            bootstrap_servers=bootstrap,
            external=kafka_pid is None,
            pid=kafka_pid,
            log_path=None if kafka_pid is None else kafka_layout.server_log,
        ),
        imap=ImapInfo(
            host=HOST,
            port=ports["imap"],
            accounts=tuple(Account(u, p) for u, p in dovecot.users(imap.passwd_file)),
            pid=imap.pid,
            log_path=imap.log_path,
            config_path=imap.config_path,
            passwd_file=imap.passwd_file,
            mail_dir=imap.mail_dir,
            kind=imap_kind,
        ),
        smtp=SmtpInfo(
            host=HOST,
            port=ports["smtp"],
            received_dir=received_dir,
            pid=smtp_pid,
            log_path=smtp_log,
        ),
        registry=None
        if schema_registry is None
        else RegistryInfo(
            url=schema_registry.url,
            pid=schema_registry.pid,
            log_path=registry.RegistryLayout(registry_dir).stdout_log,
        ),
        secure=secured_kafka,
    )


def down(state_dir: Path | str | None = None) -> list[int]:
    """Stop every process group recorded for ``state_dir``; returns the ids that were running."""
    root = resolve_state_dir(state_dir)
    state = _read_state(root)
    if state is None:
        return []
    stopped = [
        pid for pid, started in _recorded(state) if process.stop_group(pid, expected_start=started)
    ]
    _state_path(root).unlink(missing_ok=True)
    return stopped


def smtp_probe(host: str, port: int, timeout: float = 2.0) -> None:
    """Raise unless an SMTP server greets and answers EHLO at ``host:port``."""
    import smtplib

    with smtplib.SMTP(host, port, timeout=timeout) as client:
        code, _ = client.ehlo("mailtap-dev-probe")
        if code != 250:
            raise RuntimeError(f"EHLO answered {code}")


# --- mailtap config ---------------------------------------------------------------------------


def config_document(info: DevServices) -> dict[str, Any]:
    """The mailtap configuration for these services (loaded by connectors.core.config)."""
    account = next(
        (a for a in info.imap.accounts if a.username == CONFIG_ACCOUNT), info.imap.accounts[0]
    )
    kafka_section: dict[str, Any] = {"bootstrap_servers": info.kafka.bootstrap_servers}
    if info.registry is not None:
        kafka_section["schema_registry_url"] = info.registry.url
    return {
        "kafka": kafka_section,
        "claim_check": {"url": info.claims_dir.as_uri()},
        "imap": {
            "accounts": [
                {
                    "name": account.username.split("@")[0],
                    "host": info.imap.host,
                    "port": info.imap.port,
                    "security": "plain",
                    "username": account.username,
                    "password": account.password,
                    "folders": ["INBOX"],
                    "start": "all",
                }
            ]
        },
        "smtp": {
            "host": info.smtp.host,
            "port": info.smtp.port,
            "security": "plain",
            "from_address": SMTP_FROM_ADDRESS,
        },
        "health": {"port": 0},
    }


def write_config(info: DevServices) -> Path:
    info.claims_dir.mkdir(parents=True, exist_ok=True)
    header = "# Written by `mailtap dev up` for the local development services.\n"
    document = config_document(info)
    info.config_path.write_text(
        header + yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
    )
    if info.secure is not None:
        # A streams section too, so that `mailtap run streams` starts from these as they are.
        streams = {
            **scenario.streams_section("mailtap-dev"),
            "data_dir": str(info.state_dir / "streams"),
        }
        secure_kafka.write_client_configs(
            info.secure,
            {**document, "streams": streams},
            "# Written by `mailtap dev up --secure`: one component, one mechanism (credentials "
            "inside: keep private).\n",
        )
    return info.config_path
