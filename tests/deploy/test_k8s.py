"""The Kubernetes manifests (deploy/k8s/base and the example overlay's Secret): valid against the
Kubernetes schemas in strict mode, and run by ``podman kube play`` as pods whose containers reach
healthy and do not restart. What the schemas cannot catch (selectors, image tag, runAsUser, the
ConfigMap's config per component) is in tests/unit/deploy; here the running image is compared."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from mailtap.dev.process import free_ports
from tests.deploy.containers import healthz
from tests.deploy.test_components import component_env
from tests.ews_server.fixture import PASSWORD as EWS_PASSWORD
from tests.ews_server.fixture import USER as EWS_USER
from tests.ews_server.fixture import fast_server
from tests.support import deploy

VERSIONS = ("1.29", "1.37")  # an older supported minor and the newest bundled schemas


def secret_manifest() -> dict:
    """The Secret the example overlay's secretGenerator makes from credentials.env."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "mailtap-credentials"},
        "type": "Opaque",
        "stringData": deploy.secret_keys_example(),
    }


def validate(*files: Path, version: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "kubernetes_validate",
            "--strict",
            "--quiet",
            "-k",
            version,
            *map(str, files),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_manifests_pass_strict_schema_validation(version: str, tmp_path: Path) -> None:
    secret = tmp_path / "secret.yaml"
    secret.write_text(yaml.safe_dump(secret_manifest()))
    files = deploy.k8s_files()  # the base and the optional components
    overlay = deploy.ROOT / "deploy" / "k8s" / "overlays" / "example"
    result = validate(*files, overlay / "namespace.yaml", secret, version=version)
    assert result.returncode == 0, result.stdout + result.stderr
    # The validator is strict indeed: a misspelt key fails.
    typo = tmp_path / "typo.yaml"
    typo.write_text(
        (deploy.K8S_BASE / "streams.yaml")
        .read_text()
        .replace("readOnlyRootFilesystem", "readOnlyRootFileSystem")
    )
    assert validate(typo, version=version).returncode != 0


def test_image_matches_the_manifests(podman, image) -> None:
    config = json.loads(podman.run("image", "inspect", image).stdout)[0]["Config"]
    assert config["User"] == deploy.dockerfile_user()
    for deployment in deploy.k8s_workloads():
        pod = deployment["spec"]["template"]["spec"]
        assert config["User"].split(":")[0] == str(pod["securityContext"]["runAsUser"])
        assert (
            pod["containers"][0]["image"].rsplit(":", 1)[1]
            == config["Labels"]["org.opencontainers.image.version"]
        )
    assert "9108/tcp" in config["ExposedPorts"]


def local_manifests(
    image: str, env: dict[str, str], ports: dict[str, int], suffix: str
) -> list[dict]:
    """The base manifests as they run on this machine: the local image, the host's network (the
    test services are on the loopback), the Secret's values inline (podman 4.3 panics on Secret
    volumes and has no Secret objects of its own), the cluster/mailbox/relay from ``env``,
    probes left to the test (podman's conversion needs systemd)."""
    docs = []
    for doc in deploy.k8s_documents():
        if doc["kind"] not in ("ConfigMap", *deploy.WORKLOAD_KINDS):
            continue  # a Service or budget means nothing to podman
        if doc["kind"] in deploy.WORKLOAD_KINDS and deploy.deployment_component(doc) in NOT_PLAYED:
            continue
        doc = copy.deepcopy(doc)
        if doc["kind"] == "StatefulSet":
            # podman kube play has no StatefulSet; one replica of it is a Deployment's pod with
            # the first replica's name as smtp.instance_id (deploy.deployment_env).
            doc["kind"] = "Deployment"
            for key in ("serviceName", "podManagementPolicy", "updateStrategy"):
                doc["spec"].pop(key)
        if doc["kind"] == "ConfigMap":
            # podman keeps a ConfigMap as a named volume after --down: a name of this run only.
            doc["metadata"]["name"] += suffix
        if doc["kind"] == "Deployment":
            component = deploy.deployment_component(doc)
            pod = doc["spec"]["template"]["spec"]
            pod["hostNetwork"] = True
            # One pod each: replicas on one host network would share the health port and the
            # host name (the sink's transactional id); in a cluster each pod has its own.
            doc["spec"]["replicas"] = 1
            container = pod["containers"][0]
            container["image"] = image
            inline = deploy.deployment_env(doc, deploy.secret_keys_example())
            local = {**inline, **env, "MAILTAP__HEALTH__PORT": str(ports[component])}
            if component == "console":  # its /healthz is on its own port
                local["MAILTAP__CONSOLE__PORT"] = str(ports[component])
                local["MAILTAP__CONSOLE__HOST"] = "127.0.0.1"
            container["env"] = [{"name": k, "value": v} for k, v in local.items()]
            container.pop("envFrom", None)  # read into env above: no Secret objects in podman
            for volume in pod["volumes"]:  # the console's tokens: the example file, as a ConfigMap
                if volume.get("secret", {}).get("secretName") == CONSOLE_TOKENS:
                    volume.pop("secret")
                    volume["configMap"] = {"name": CONSOLE_TOKENS}  # + suffix below
                    docs.append(secret_as_configmap(CONSOLE_TOKENS + suffix))
            secrets = {v["name"] for v in pod["volumes"] if "secret" in v}
            pod["volumes"] = [v for v in pod["volumes"] if v["name"] not in secrets]
            container["volumeMounts"] = [
                m for m in container["volumeMounts"] if m["name"] not in secrets
            ]
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                container.pop(probe)
            for volume in pod["volumes"]:
                if "configMap" in volume:
                    volume["configMap"]["name"] += suffix
            container.pop("ports")  # host network: no port mappings (podman refuses them)
        docs.append(doc)
    return docs


CONSOLE_TOKENS = "mailtap-console-tokens"


def secret_as_configmap(name: str) -> dict:
    """The console's tokens Secret as podman can mount it: a ConfigMap of the example file."""
    example = deploy.ROOT / "deploy" / "k8s" / "overlays" / "example"
    text = (example / "console-tokens.yaml.example").read_text()
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {"tokens.yaml": text},
    }


#: Workloads kube play leaves out (see kube_play).
NOT_PLAYED = ("graph-source",)


@pytest.mark.timeout(600)
def test_kube_play_runs_each_deployment_without_restarts(
    podman, image, services, unique, imap_account, tmp_path
):
    with fast_server() as ews:  # the Exchange source's mailbox (deploy/k8s/components)
        kube_play(podman, image, services, unique, imap_account, tmp_path, ews.url)


def kube_play(podman, image, services, unique, imap_account, tmp_path, ews_url: str) -> None:
    env = {
        **component_env(services, unique, imap_account),
        "MAILTAP__KAFKA__SECURITY_PROTOCOL": "PLAINTEXT",
        "MAILTAP__KAFKA__SASL_MECHANISM": "null",
        "MAILTAP__KAFKA__REPLICATION_FACTOR": "1",
        "MAILTAP__CLAIM_CHECK__URL": "file:///var/lib/mailtap/claims",
        "MAILTAP__SMTP__USERNAME": "null",
        "MAILTAP__SMTP__PASSWORD": "null",
        "MAILTAP__EWS__ACCOUNTS__0__SERVICE_ENDPOINT": ews_url,
        "MAILTAP__EWS__ACCOUNTS__0__EMAIL": EWS_USER,
        "MAILTAP__EWS__ACCOUNTS__0__AUTH": "basic",
        "MAILTAP__EWS__ACCOUNTS__0__USERNAME": EWS_USER,
        "MAILTAP__EWS__ACCOUNTS__0__PASSWORD": EWS_PASSWORD,
    }
    # Not the graph-source: it needs Microsoft's authority and Graph over HTTPS, which the
    # container cannot reach here (its own tests run it against tests/graph_server).
    deployments = [
        c
        for c in (deploy.deployment_component(d) for d in deploy.k8s_workloads())
        if c not in NOT_PLAYED
    ]
    ports = dict(zip(deployments, free_ports(len(deployments)), strict=True))
    play = tmp_path / "play.yaml"
    suffix = f"-{unique}"
    play.write_text(yaml.safe_dump_all(local_manifests(image, env, ports, suffix)))
    # The topics first, as in deploy/README.md (a Job or an admin does it on a real cluster).
    config = tmp_path / "mailtap.yaml"
    config.write_text(deploy.configmap_config())
    config.chmod(0o644)
    podman.run(
        "run",
        "--rm",
        "--network",
        "host",
        "-v",
        f"{config}:/etc/mailtap/mailtap.yaml:ro",
        *[f"--env={k}={v}" for k, v in env.items()],
        image,
        "topics",
        "ensure",
    )
    # --replace: the pods of a run killed before its teardown (same names) would refuse this one.
    podman.run("kube", "play", "--replace", str(play), timeout=300)
    try:
        deadline = time.monotonic() + 180
        pending = dict(ports)
        while pending and time.monotonic() < deadline:
            pending = {c: p for c, p in pending.items() if healthz(p)[0] != 200}
            time.sleep(2)
        assert not pending, f"not healthy: {pending}\n{pod_logs(podman)}"
        time.sleep(30)
        containers = json.loads(podman.run("ps", "-a", "--format", "json").stdout)
        ours = [
            c
            for c in containers
            if any(n.startswith("mailtap-") for n in c["Names"]) and not c.get("IsInfra")
        ]
        assert len(ours) == len(deployments), [c["Names"] for c in ours]
        for container in ours:
            inspect = json.loads(podman.run("inspect", container["Id"]).stdout)[0]
            assert inspect["State"]["Status"] == "running", (container["Names"], pod_logs(podman))
            assert inspect["RestartCount"] == 0, (
                container["Names"],
                inspect["State"],
                podman.run("logs", "--tail", "200", container["Id"], check=False).stderr,
            )
        assert all(healthz(p)[0] == 200 for p in ports.values())
    finally:
        podman.run("kube", "play", "--down", str(play), check=False, timeout=120)
        names = [c["metadata"]["name"] for c in deploy.k8s_kind("ConfigMap")]
        for name in [*names, CONSOLE_TOKENS]:
            podman.run("volume", "rm", "--force", name + suffix, check=False)


def pod_logs(podman) -> str:
    out = []
    for line in podman.run("ps", "-a", "--format", "{{.Names}}").stdout.split():
        if line.startswith("mailtap-") and "infra" not in line:
            out.append(
                f"--- {line}\n" + podman.run("logs", "--tail", "30", line, check=False).stderr
            )
    return "\n".join(out)
