"""Every config shipped in deploy/ (and docker-compose.yml) starts each component that uses it:
``mailtap config check --component NAME`` with the environment the compose service or the
Kubernetes Deployment gives that component. Plus what the Kubernetes schemas cannot catch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from connectors.core.config import load_config
from connectors.smtp.config import SmtpSinkSettings
from mailtap.cli import main
from mailtap.commands.run import COMPONENTS
from streams.config import StreamsSettings
from tests.support import deploy

SERVICES = deploy.mailtap_services()
DEPLOYMENTS = {deploy.deployment_component(d): d for d in deploy.k8s_workloads()}


def config_check(path: Path, component: str, env: dict[str, str]) -> tuple[int, str]:
    # Only the given environment: a MAILTAP_* variable of the caller must not mask a gap.
    clean = dict.fromkeys(n for n in os.environ if n.startswith("MAILTAP"))
    result = CliRunner().invoke(
        main,
        ["config", "check", "-c", str(path), "--component", component],
        env={**clean, **env},  # type: ignore[dict-item]
    )
    return result.exit_code, result.output


def test_compose_runs_every_long_running_component() -> None:
    assert {s["command"][1] for s in SERVICES.values()} == {
        "imap-source",
        "ews-source",
        "streams",
        "smtp-sink",
        "console",
    }


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_compose_config_starts_the_service_component(name: str) -> None:
    service = SERVICES[name]
    component = service["command"][1]
    code, output = config_check(
        deploy.compose_config_file(service), component, service["environment"]
    )
    assert code == 0, output
    assert f"valid for {component}" in output


def test_compose_points_at_an_existing_cluster_through_the_environment() -> None:
    env = {
        "MAILTAP_KAFKA_BOOTSTRAP": "b1.example.com:9093,b2.example.com:9093",
        "MAILTAP__KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "MAILTAP__KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
        "MAILTAP__KAFKA__SCHEMA_REGISTRY_URL": "https://u:p@registry.example.com",
    }
    for service in deploy.mailtap_services(env).values():
        assert {k: service["environment"][k] for k in env} == env
        # The login is the service's own (its user, its secret file): test_compose_logins.
        code, output = config_check(
            deploy.compose_config_file(service), service["command"][1], service["environment"]
        )
        assert code == 0, output


@pytest.mark.parametrize(
    ("variable", "component", "says"),
    [
        ("MAILTAP__IMAP__ACCOUNTS__0__PASSWORD", "imap-source", "password"),
        ("MAILTAP__STREAMS__FROM_ADDRESS__ADDRESS", "streams", "streams.from_address"),
        ("MAILTAP__SMTP__FROM_ADDRESS", "smtp-sink", "smtp.from_address"),
    ],
)
def test_compose_stops_at_start_without_a_required_variable(
    variable: str, component: str, says: str
) -> None:
    # Never a placeholder: a reply from support@example.com or a login without a password.
    (service,) = [s for s in SERVICES.values() if s["command"][1] == component]
    env = {k: v for k, v in service["environment"].items() if k != variable}
    code, output = config_check(deploy.compose_config_file(service), component, env)
    assert code != 0
    assert says in output, output


def test_every_variable_of_the_env_file_reaches_every_container(tmp_path: Path) -> None:
    env_file = tmp_path / "mailtap.env"
    env_file.write_text(
        "MAILTAP__IMAP__ACCOUNTS__0__PASSWORD=imap-secret\n"
        "MAILTAP__STREAMS__FROM_ADDRESS__ADDRESS=help@example.org\n"
        "MAILTAP__STREAMS__FROM_ADDRESS__NAME='Example Help'\n"
        "MAILTAP__SMTP__FROM_ADDRESS=bounces@example.org\n"
        # Keys the compose file does not name: they arrive all the same.
        "MAILTAP__STREAMS__WORKFLOWS__TICKET_INTAKE__REQUIRE=none\n"
        "MAILTAP__STREAMS__MAX_REPLY_AGE=36h\n"
        "MAILTAP__SMTP__POOL_SIZE=3\n"
    )
    values = deploy.read_env_file(env_file)
    services = deploy.compose_services()
    for name in ("topics", "imap-source", "streams", "smtp-sink", "ews-source"):
        env = deploy.container_env(services[name], values)
        assert {k: env[k] for k in values} == values, name
    streams_env = deploy.container_env(services["streams"], values)
    streams_env["MAILTAP_SECRETS_DIR"] = str(
        deploy.container_secrets(services["streams"], tmp_path)
    )
    config = load_config(deploy.compose_config_file(services["streams"]), env=streams_env)
    streams = config.section("streams", StreamsSettings)
    assert streams.from_address.address == "help@example.org"
    assert streams.from_address.name == "Example Help"
    assert streams.max_reply_age_seconds == 36 * 3600
    # A workflow's require from the environment, with nothing forcing auth_policy beside it.
    assert streams.policy_for("ticket_intake") == "none"
    sink_env = deploy.container_env(services["smtp-sink"], values)
    sink_env["MAILTAP_SECRETS_DIR"] = str(deploy.container_secrets(services["smtp-sink"], tmp_path))
    sink = load_config(deploy.compose_config_file(services["smtp-sink"]), env=sink_env)
    smtp = sink.section("smtp", SmtpSinkSettings)
    assert (smtp.from_address, smtp.pool_size) == ("bounces@example.org", 3)


def test_compose_forces_no_setting_on_the_containers() -> None:
    # Only where the config file is: a value here would beat the env file's (compose's
    # precedence), as MAILTAP__STREAMS__AUTH_POLICY once beat every workflow's require.
    # The one exception is the service's own Kafka user, which must beat a shared env file's.
    for name, service in deploy.compose_services().items():
        if "env_file" in service:
            assert set(service.get("environment") or {}) <= {
                "MAILTAP_CONFIG",
                "MAILTAP_SECRETS_DIR",
                "MAILTAP__KAFKA__SASL_USERNAME",
            }, name


def test_shipped_sources_start_at_the_latest_mail() -> None:
    # start: all answers years of customers on the first start (issue 28); the guard
    # streams.max_reply_age is the second line of defence, not the first.
    files = [
        deploy.compose_config_file(s) for s in SERVICES.values() if "source" in s["command"][1]
    ]
    texts = [yaml.safe_load(f.read_text()) for f in files]
    texts += [
        yaml.safe_load(data)
        for configmap in deploy.k8s_kind("ConfigMap")
        for data in configmap["data"].values()
    ]
    accounts = [
        account
        for text in texts
        for section in ("imap", "ews")
        for account in (text.get(section) or {}).get("accounts", [])
    ]
    assert accounts and {a.get("start", "latest") for a in accounts} == {"latest"}


def test_compose_broker_and_registry_only_in_the_local_kafka_profile() -> None:
    services = deploy.compose_services()
    assert services["kafka"]["profiles"] == ["local-kafka"]
    assert services["schema-registry"]["profiles"] == ["local-kafka"]
    assert all("depends_on" not in s for s in SERVICES.values())
    assert {n for n, s in SERVICES.items() if "profiles" in s} == {"ews-source", "console"}


def test_compose_config_alone_names_its_components(tmp_path: Path) -> None:
    (service, *_) = SERVICES.values()
    result = CliRunner().invoke(
        main,
        ["config", "check", "-c", str(deploy.compose_config_file(service))],
        env=dict(deploy.COMPOSE_REQUIRED),
    )
    assert result.exit_code == 0, result.output
    assert "valid for imap-source, streams, smtp-sink, console" in result.output


def test_k8s_one_deployment_per_component() -> None:
    # ews-source is an optional kustomize component (deploy/k8s/components/ews-source).
    assert set(DEPLOYMENTS) == set(COMPONENTS)
    assert len(deploy.k8s_workloads()) == len(COMPONENTS)


def test_k8s_sink_replicas_keep_their_transactional_ids() -> None:
    # A Deployment names each new pod anew: a zombie sink would never be fenced. A StatefulSet's
    # pod names are stable per replica and become smtp.instance_id, hence the transactional id.
    sink = DEPLOYMENTS["smtp-sink"]
    assert sink["kind"] == "StatefulSet"
    (container,) = sink["spec"]["template"]["spec"]["containers"]
    (instance,) = [e for e in container["env"] if e["name"] == "MAILTAP__SMTP__INSTANCE_ID"]
    assert instance["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    services = {s["metadata"]["name"]: s for s in deploy.k8s_kind("Service")}
    assert services[sink["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"


@pytest.mark.parametrize("component", sorted(DEPLOYMENTS))
def test_k8s_every_component_logs_in_to_kafka_from_its_own_secrets(component: str) -> None:
    pod = DEPLOYMENTS[component]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (login,) = container["envFrom"]
    assert login["secretRef"]["name"] == f"mailtap-kafka-{component}"
    assert not [e for e in container.get("env", []) if e["name"].startswith("MAILTAP__KAFKA__")]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["kafka-tls"]["secret"]["secretName"] == f"mailtap-kafka-tls-{component}"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["kafka-tls"] == "/var/run/secrets/mailtap/kafka"
    # Each mechanism's credentials are in the example: SCRAM active, mTLS and OAuth commented.
    example = (deploy.K8S_EXAMPLE_OVERLAY / f"kafka-{component}.env.example").read_text()
    for variable in (
        "SASL_PASSWORD",
        "SSL_KEY_PASSWORD",
        "SASL_OAUTHBEARER__CLIENT_SECRET",
    ):
        assert f"MAILTAP__KAFKA__{variable}=" in example


@pytest.mark.parametrize("component", sorted(DEPLOYMENTS))
def test_k8s_configmap_starts_the_deployment_component(component: str, tmp_path: Path) -> None:
    config = tmp_path / "mailtap.yaml"
    config.write_text(deploy.configmap_config(deploy.deployment_configmap(DEPLOYMENTS[component])))
    env = deploy.deployment_env(DEPLOYMENTS[component], deploy.secret_keys_example())
    code, output = config_check(config, component, env)
    assert code == 0, output


def test_k8s_configmap_holds_no_credential() -> None:
    for configmap in deploy.k8s_kind("ConfigMap"):
        text = configmap["data"]["mailtap.yaml"]
        for word in ("password:", "secret_access_key:", "access_key_id:", "token:"):
            assert word not in text
    assert all(d["kind"] != "Secret" for d in deploy.k8s_documents())


@pytest.mark.parametrize("component", sorted(DEPLOYMENTS))
def test_k8s_what_the_schemas_cannot_catch(component: str) -> None:
    deployment = DEPLOYMENTS[component]
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert container["image"].rsplit(":", 1)[1] == deploy.project_version()
    assert labels["app.kubernetes.io/version"] == deploy.project_version()
    assert str(pod["securityContext"]["runAsUser"]) == deploy.dockerfile_user().split(":")[0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/var/lib/mailtap", "/tmp", "/etc/mailtap"} <= mounts
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] in {
        c["metadata"]["name"] for c in deploy.k8s_kind("ConfigMap")
    }
    port_names = {p["name"] for p in container["ports"]}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] == "/healthz"
        assert container[probe]["httpGet"]["port"] in port_names
    assert "limits" in container["resources"] and "requests" in container["resources"]
    refs = [e["valueFrom"].get("secretKeyRef") for e in container["env"] if "valueFrom" in e]
    for ref in filter(None, refs):
        assert ref["key"] in deploy.secret_keys_example()
    if component == "streams":
        # The shipped default: one worker; more share the conversations (streams/README.md).
        assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"


def test_k8s_service_and_budget_select_pods_that_exist() -> None:
    pod_labels = [d["spec"]["template"]["metadata"]["labels"] for d in DEPLOYMENTS.values()]
    container_ports = {
        p["name"]
        for d in DEPLOYMENTS.values()
        for p in d["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    (service,) = deploy.k8s_kind("Service")
    assert sum(service["spec"]["selector"].items() <= lab.items() for lab in pod_labels) == len(
        pod_labels
    )
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports
    for budget in deploy.k8s_kind("PodDisruptionBudget"):
        selector = budget["spec"]["selector"]["matchLabels"]
        (target,) = [
            d
            for d in DEPLOYMENTS.values()
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert target["spec"]["replicas"] > budget["spec"]["minAvailable"]


def test_state_paths_are_where_the_image_lets_the_user_write() -> None:
    # The image runs as 10001 and only /var/lib/mailtap is its own: streams' data_dir and a
    # file:// claim store must lie there (they were root-owned /srv/mailtap paths before).
    text = deploy.DOCKERFILE.read_text()
    assert "chown -R 10001:10001 /var/lib/mailtap" in text
    assert "WORKDIR /var/lib/mailtap" in text
    assert deploy.dockerfile_user() == "10001:10001"
    (service, *_) = SERVICES.values()
    configs = [
        yaml.safe_load(deploy.compose_config_file(service).read_text()),
        yaml.safe_load(deploy.configmap_config()),
    ]
    for config in configs:
        assert config["streams"]["data_dir"].startswith("/var/lib/mailtap/")
        url = config["claim_check"]["url"]
        assert url.startswith("s3://") or url.startswith("file:///var/lib/mailtap/")


@pytest.mark.parametrize("shipped", ["compose", "k8s"])
def test_shipped_configs_put_every_name_inside_the_namespace(shipped: str, tmp_path: Path) -> None:
    # A name the shipped file spelt out (an app id, a group id) would stay outside the
    # namespace: two deployments would share a consumer group (issue 27 item 5).
    from connectors.imap.config import ImapSourceSettings

    path = tmp_path / "mailtap.yaml"
    if shipped == "compose":
        path.write_text(deploy.compose_config_file(next(iter(SERVICES.values()))).read_text())
    else:
        path.write_text(deploy.configmap_config())
    env = {
        "MAILTAP__KAFKA__NAMESPACE": "prod",
        # The Kubernetes login comes from each component's Secret (envFrom).
        **deploy.secret_env_example("mailtap-kafka-imap-source"),
        "MAILTAP__IMAP__ACCOUNTS__0__PASSWORD": "x",
        "MAILTAP__STREAMS__FROM_ADDRESS__ADDRESS": "support@example.com",
        "MAILTAP__SMTP__FROM_ADDRESS": "support@example.com",
    }
    config = load_config(path, env=env)
    names = list(config.kafka.topics.model_dump().values())
    streams = config.section("streams", StreamsSettings)
    sink = config.section("smtp", SmtpSinkSettings)
    imap = config.section("imap", ImapSourceSettings)
    assert imap.group is not None
    names += [streams.app_id, sink.group_id, sink.bounce_group_id, sink.state_topic]
    names += [imap.group.id, imap.group.topic("imap")]
    assert [n for n in names if not n.startswith("prod.")] == []
