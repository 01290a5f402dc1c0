"""What the deploy tests read from the shipped files: the compose services with the environment
their containers get from the env file, the Kubernetes manifests, each Deployment's component
and environment.

Compose interpolation (``${VAR:-default}``, ``${VAR:?message}``) is resolved here rather than
through ``podman-compose config`` so that the unit tests need neither podman nor a network;
tests/deploy checks the same file with podman-compose itself.
"""

from __future__ import annotations

import re
import tempfile
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from dotenv import dotenv_values

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
K8S_BASE = ROOT / "deploy" / "k8s" / "base"
#: The env file's variables a user must set (deploy/compose/mailtap.env.example): without them
#: a component stops at start (the EWS password only with --profile ews).
COMPOSE_REQUIRED = {
    "MAILTAP__IMAP__ACCOUNTS__0__PASSWORD": "imap-secret",
    "MAILTAP__EWS__ACCOUNTS__0__PASSWORD": "ews-secret",
    "MAILTAP__STREAMS__FROM_ADDRESS__ADDRESS": "help@example.org",
    "MAILTAP__SMTP__FROM_ADDRESS": "bounces@example.org",
}

_VAR = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def project_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as file:
        version: str = tomllib.load(file)["project"]["version"]
    return version


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's variable syntax: ``${V}``, ``${V:-d}``, ``${V-d}``, ``${V:?m}``, ``${V?m}``."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"] or ""
        value = env.get(name)
        empty = value is None or (value == "" and op is not None and op.startswith(":"))
        if op in ("-", ":-"):
            return arg if empty else str(value)
        if op in ("?", ":?"):
            if empty:
                raise KeyError(f"compose needs {name}: {arg}")
            return str(value)
        return value or ""

    return _VAR.sub(one, text.replace("$$", "\0")).replace("\0", "$")


def compose_services(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The services with ``${...}`` resolved from ``env`` (the shell or ``--env-file``)."""
    text = interpolate(COMPOSE_FILE.read_text(), env or {})
    services: dict[str, Any] = yaml.safe_load(text)["services"]
    return services


def compose_secrets(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The top-level ``secrets:`` with ``${...}`` resolved from ``env``."""
    text = interpolate(COMPOSE_FILE.read_text(), env or {})
    secrets: dict[str, Any] = yaml.safe_load(text)["secrets"]
    return secrets


def read_env_file(path: Path) -> dict[str, str]:
    """An env file as compose reads it (python-dotenv, podman-compose's own parser)."""
    return {k: v or "" for k, v in dotenv_values(path).items()}


def container_env(service: Mapping[str, Any], env_file: Mapping[str, str]) -> dict[str, str]:
    """What a container of ``service`` gets: every variable of its env file, then its
    ``environment`` on top (compose's precedence), every value a string."""
    assert service.get("env_file"), "the service reads no env file"
    env = {**env_file, **(service.get("environment") or {})}
    return {k: str(v) for k, v in env.items()}


def mailtap_services(env_file: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The compose services that run a mailtap component (``command: [run, NAME, ...]``), each
    ``environment`` replaced by the container's whole environment when the env file holds
    :data:`COMPOSE_REQUIRED` and ``env_file``."""
    values = {**COMPOSE_REQUIRED, **(env_file or {})}
    services = {
        name: service
        for name, service in compose_services().items()
        if (service.get("command") or [None])[0] == "run"
    }
    for service in services.values():
        service["environment"] = container_env(service, values)
        if "MAILTAP_SECRETS_DIR" in service["environment"]:
            folder = Path(tempfile.mkdtemp(prefix="mailtap-compose-secrets-"))
            service["environment"]["MAILTAP_SECRETS_DIR"] = str(container_secrets(service, folder))
    return services


#: What the container of a compose service finds under /run/secrets for a relative target.
SECRETS_MOUNT = "/run/secrets"


def service_secrets(service: Mapping[str, Any]) -> dict[str, str]:
    """``{path in the container: secret name}`` of a service's compose secrets."""
    paths: dict[str, str] = {}
    for secret in service.get("secrets") or []:
        name = secret if isinstance(secret, str) else secret["source"]
        target = name if isinstance(secret, str) else secret.get("target", name)
        paths[target if target.startswith("/") else f"{SECRETS_MOUNT}/{target}"] = name
    return paths


def container_secrets(service: Mapping[str, Any], folder: Path) -> Path:
    """``folder`` holding the files a container of ``service`` finds in /run/secrets, each
    secret's content a stand-in naming the secret (``password of kafka-streams``)."""
    for path, name in service_secrets(service).items():
        if path.startswith(f"{SECRETS_MOUNT}/"):
            target = folder / path.removeprefix(f"{SECRETS_MOUNT}/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f"password of {name}\n")
    return folder


def on_host(container_path: str, folder: Path) -> str:
    """A path under /run/secrets of the container, in the folder of :func:`container_secrets`."""
    assert container_path.startswith(SECRETS_MOUNT), container_path
    return str(folder / container_path.removeprefix(SECRETS_MOUNT).lstrip("/"))


def compose_config_file(service: Mapping[str, Any]) -> Path:
    """The host file mounted at the service's MAILTAP_CONFIG."""
    target = service["environment"]["MAILTAP_CONFIG"]
    for volume in service["volumes"]:
        source, _, rest = volume.partition(":")
        if rest.split(":")[0] == target:
            return (ROOT / source).resolve()
    raise AssertionError(f"nothing is mounted at {target}")


K8S_COMPONENTS = ROOT / "deploy" / "k8s" / "components"


def k8s_files() -> list[Path]:
    """The manifests of the kustomize base and of every optional component, in resources order."""
    files: list[Path] = []
    for folder in (K8S_BASE, *sorted(p for p in K8S_COMPONENTS.iterdir() if p.is_dir())):
        kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
        files += [folder / resource for resource in kustomization["resources"]]
    return files


def k8s_documents() -> list[dict[str, Any]]:
    """Every manifest of :func:`k8s_files`."""
    docs: list[dict[str, Any]] = []
    for file in k8s_files():
        docs += [d for d in yaml.safe_load_all(file.read_text()) if d]
    return docs


def k8s_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in k8s_documents() if d["kind"] == kind]


#: The kinds that run a component: Deployments, and the sink's StatefulSet (stable pod names).
WORKLOAD_KINDS = ("Deployment", "StatefulSet")
K8S_EXAMPLE_OVERLAY = ROOT / "deploy" / "k8s" / "overlays" / "example"


def k8s_workloads() -> list[dict[str, Any]]:
    return [d for d in k8s_documents() if d["kind"] in WORKLOAD_KINDS]


def secret_env_example(secret_name: str) -> dict[str, str]:
    """The variables of an ``envFrom`` Secret ``mailtap-<name>``, from the example overlay's
    ``<name>.env.example`` (its active lines)."""
    example = K8S_EXAMPLE_OVERLAY / f"{secret_name.removeprefix('mailtap-')}.env.example"
    pairs = [
        line.split("=", 1)
        for line in example.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return {key: value for key, value in pairs}


def deployment_component(deployment: Mapping[str, Any]) -> str:
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "run", args
    return str(args[1])


def deployment_env(deployment: Mapping[str, Any], secret: Mapping[str, str]) -> dict[str, str]:
    """The container's environment: ``envFrom`` Secrets from the example overlay's env files,
    secretKeyRefs read from ``secret`` (key -> value), the pod name as the first replica's."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(secret_env_example(source["secretRef"]["name"]))
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
        elif "fieldRef" in entry["valueFrom"]:
            assert entry["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", entry
            env[entry["name"]] = f"{deployment['metadata']['name']}-0"
        else:
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = secret[ref["key"]]
    return env


def secret_keys_example() -> dict[str, str]:
    """The keys of the credentials Secret, from the overlay's credentials.env.example."""
    example = ROOT / "deploy" / "k8s" / "overlays" / "example" / "credentials.env.example"
    pairs = [
        line.split("=", 1)
        for line in example.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return {key: value for key, value in pairs}


def configmap_config(name: str = "mailtap-config") -> str:
    (configmap,) = [c for c in k8s_kind("ConfigMap") if c["metadata"]["name"] == name]
    text: str = configmap["data"]["mailtap.yaml"]
    return text


def deployment_configmap(deployment: Mapping[str, Any]) -> str:
    """The name of the ConfigMap a Deployment mounts as its config."""
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    name: str = volumes["config"]["configMap"]["name"]
    return name


def dockerfile_user() -> str:
    users = [
        line.split()[1] for line in DOCKERFILE.read_text().splitlines() if line.startswith("USER ")
    ]
    return users[-1]
