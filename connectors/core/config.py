"""Deployment configuration: one YAML file, environment overrides, validated at start.

The file is a mapping of sections. The core validates ``kafka``, ``claim_check`` and ``health``;
each connector validates its own section through :meth:`MailtapConfig.section`, so the core never
imports a connector (dependency direction in DESIGN.md).

Environment overrides: ``MAILTAP__<SECTION>__<KEY>[__<KEY>...]=value`` sets a nested key;
``MAILTAP_KAFKA_BOOTSTRAP`` overrides ``kafka.bootstrap_servers`` (the variable the test suite
and the demo honour). A value takes the type of the field it sets (:func:`typed_env_values`): a
string field (a password, an address, a host) gets the variable's text as it is — ``pass #1``,
``0777`` and ``!x`` stay what they say —, a number or a bool is parsed by the model
(``MAILTAP__HEALTH__PORT=9100``), a list or a mapping is read as YAML
(``MAILTAP__IMAP__ACCOUNTS__0__FOLDERS=[INBOX, Archive]``), and ``null`` (or ``~``) unsets an
optional field (a required string field takes it as text).
``MAILTAP_SECRETS_DIR`` names a directory whose files named ``MAILTAP__<SECTION>__<KEY>`` set
that key like the variable would (:mod:`connectors.core.secret_files`: compose secrets).
``MAILTAP__KAFKA__BOOTSTRAP_SERVERS`` is the same setting spelt generically: both are
resolved in one place, :func:`env_bootstrap_servers`, and setting both to different values is
an error rather than one silently winning.
We merge these ourselves rather than with pydantic-settings' env source because connector sections
are opaque to the core until their owner validates them.

Example::

    kafka:
      bootstrap_servers: 127.0.0.1:9092
    claim_check:
      url: file:///var/lib/mailtap/claims
"""

from __future__ import annotations

import os
import re
import types
from collections.abc import Mapping
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from connectors.core import namespace as ns
from connectors.core.config_errors import closest, describe, env_sources, missing_section
from connectors.core.errors import ConfigError
from connectors.core.secret_files import with_secret_files

#: What mailtap sets on its registry subjects (connectors.core.avro.registry); the registry's
#: own names for the rules.
Compatibility = Literal[
    "FULL_TRANSITIVE",
    "FULL",
    "BACKWARD_TRANSITIVE",
    "BACKWARD",
    "FORWARD_TRANSITIVE",
    "FORWARD",
    "NONE",
]
DEFAULT_COMPATIBILITY: Compatibility = "FULL_TRANSITIVE"

ENV_PREFIX = "MAILTAP__"
ENV_KAFKA_BOOTSTRAP = "MAILTAP_KAFKA_BOOTSTRAP"
#: The generic spelling of :data:`ENV_KAFKA_BOOTSTRAP`, an alias of it.
ENV_KAFKA_BOOTSTRAP_GENERIC = f"{ENV_PREFIX}KAFKA__BOOTSTRAP_SERVERS"

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base for every settings model: unknown keys are errors (a typo must not be ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NamespacedModel(StrictModel):
    """A settings model whose default names derive from ``kafka.namespace``
    (:mod:`connectors.core.namespace`).

    The fields named in :attr:`NAMESPACED` that the file leaves unset get their default inside
    the namespace (``prod.mailtap-smtp-sink``); a value the file sets is kept as written.
    :attr:`namespace` is there for names derived later (a group's work topic).
    """

    #: The fields whose default is qualified with the namespace.
    NAMESPACED: ClassVar[tuple[str, ...]] = ()
    _namespace: str | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _namespaced_defaults(cls, data: Any, info: ValidationInfo) -> Any:
        namespace = ns.from_context(info.context)
        if namespace is None or not isinstance(data, dict):
            return data
        defaults = {
            name: ns.qualify(
                namespace, cls.model_fields[name].get_default(call_default_factory=True)
            )
            for name in cls.NAMESPACED
            if name not in data
        }
        return {**data, **defaults}

    @model_validator(mode="after")
    def _keep_namespace(self, info: ValidationInfo) -> Any:
        self._namespace = ns.from_context(info.context)
        return self

    @property
    def namespace(self) -> str | None:
        return self._namespace


class TopicNames(StrictModel):
    """Topic names; defaults as in DESIGN.md, inside ``kafka.namespace`` when it is set."""

    events: str = Field(
        default="mail.events", description="MailEvents, compacted, key = message identity"
    )
    commands: str = Field(default="mail.commands", description="ReplyCommands, key = command id")
    retry_prefix: str = Field(
        default="mail.commands.retry", description="retry topics are <retry_prefix>.<tier>"
    )
    dlq: str = Field(default="mail.commands.dlq", description="dead letters with error headers")
    delivery: str = Field(default="mail.delivery", description="DeliveryEvents, compacted")
    offsets: str = Field(default="mailtap.offsets", description="source offsets, compacted")
    workflow: str = Field(default="mail.workflow", description="WorkflowEvents, compacted")
    imap_index: str = Field(
        default="mailtap.imap-index",
        description="the IMAP source's key index changelog, compacted, partitioned by account "
        "(created by the IMAP source; connectors/imap/KEYS.md)",
    )
    suppressions: str = Field(
        default="mail.suppressions",
        description="the suppression list: Suppression records, compacted, key = normalized "
        "address; read continuously by the SMTP sink",
    )
    mailboxes: str = Field(
        default="mailtap.mailboxes",
        description="folders added or removed at runtime (`mailtap mailboxes`), compacted",
    )
    audit: str = Field(
        default="mailtap.audit",
        description="who did what when in the web console (`mailtap run console`), compacted",
    )


class TracingSettings(StrictModel):
    """W3C trace context in Kafka headers, from a mail through its reply to its delivery."""

    enabled: bool = Field(
        default=False,
        description="put a traceparent on mail.events, mail.commands and mail.delivery records "
        "(needs the 'tracing' extra)",
    )

    @field_validator("enabled")
    @classmethod
    def _packages_present(cls, value: bool) -> bool:
        from connectors.core import tracing

        if value and not tracing.available():
            raise ValueError(tracing.MISSING_PACKAGES)
        return value


class KafkaSettings(StrictModel):
    """How to reach the Kafka cluster (and optionally a Schema Registry)."""

    bootstrap_servers: str = Field(description="host:port[,host:port...] of the brokers")
    namespace: str | None = Field(
        default=None,
        description="this deployment's part of a shared cluster: every topic, consumer group, "
        "streams app id and transactional id mailtap names by default starts with "
        "'<namespace>.' (prod.mail.events, prod.mailtap-smtp-sink), so deployments with the same "
        "account names stay apart and each can be granted prefixed ACLs on '<namespace>.'; "
        "names set explicitly are used as written",
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT", description="SASL_SSL in production; certificates are always verified"
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = (
        Field(default=None, description="with SASL_PLAINTEXT/SASL_SSL")
    )
    sasl_username: str | None = Field(default=None, description="SASL user")
    sasl_password: SecretStr | None = Field(
        default=None, description="SASL password (never logged)"
    )
    ssl_ca_location: str | None = Field(
        default=None, description="CA bundle for SSL/SASL_SSL; the system store when unset"
    )
    ssl_certificate_location: str | None = Field(
        default=None,
        description="client certificate (PEM, leaf first) for mTLS, with ssl_key_location",
    )
    ssl_key_location: str | None = Field(
        default=None, description="the client certificate's private key (PEM)"
    )
    ssl_key_password: SecretStr | None = Field(
        default=None, description="when the private key file is encrypted (never logged)"
    )
    sasl_oauthbearer: ClientCredentialsSettings | None = Field(
        default=None,
        description="with sasl_mechanism OAUTHBEARER: the OIDC token endpoint and the client "
        "credentials mailtap asks it for tokens with (refreshed before they expire)",
    )
    schema_registry_url: str | None = Field(
        default=None,
        description="Confluent-compatible registry; when unset, Avro single-object encoding is used",
    )
    schema_registry: SchemaRegistryClientSettings = Field(
        default_factory=lambda: SchemaRegistryClientSettings(),
        description="how mailtap logs in to the schema registry (basic auth or a bearer "
        "token, TLS, mTLS)",
    )
    schema_compatibility: Compatibility = Field(
        default=DEFAULT_COMPATIBILITY,
        description="compatibility mailtap sets on its registry subjects before registering",
    )
    topics: TopicNames = Field(default=TopicNames(), description="topic names (defaults below)")
    partitions: int = Field(default=3, ge=1, description="partitions for topics mailtap creates")
    replication_factor: int = Field(
        default=1,
        ge=1,
        description="replication factor for topics mailtap creates (3 in production)",
    )
    client_properties: dict[str, str] = Field(
        default_factory=dict, description="extra librdkafka properties passed through verbatim"
    )
    tracing: TracingSettings = Field(
        default=TracingSettings(), description="trace context propagation (off by default)"
    )

    @field_validator("namespace")
    @classmethod
    def _namespace_is_a_name(cls, value: str | None) -> str | None:
        return None if value is None else ns.check(value)

    @model_validator(mode="before")
    @classmethod
    def _topics_in_namespace(cls, data: Any) -> Any:
        """Default topic names inside the namespace; the ones the file names stay as written."""
        if not isinstance(data, dict) or not isinstance(data.get("namespace"), str):
            return data
        namespace = ns.check(data["namespace"])
        given = data.get("topics") or {}
        if isinstance(given, TopicNames):
            given = given.model_dump(exclude_unset=True)
        if not isinstance(given, dict):
            return data
        defaults = {
            name: ns.qualify(namespace, field.get_default())
            for name, field in TopicNames.model_fields.items()
        }
        return {**data, "topics": {**defaults, **given}}

    def qualify(self, name: str) -> str:
        """A name mailtap makes up (a group id, a transactional-id prefix) inside this
        deployment's namespace: ``prod.mailtap-imap-index``."""
        return ns.qualify(self.namespace, name)

    @field_validator("bootstrap_servers")
    @classmethod
    def _has_port(cls, value: str) -> str:
        for server in value.split(","):
            host, _, port = server.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"expected host:port[,host:port], got {server.strip()!r}")
        return value

    @model_validator(mode="after")
    def _registry_login_fits_the_url(self) -> KafkaSettings:
        """The registry's login settings against its URL: confluent-kafka's client would
        refuse a login given twice only when it is built, and ignore TLS files for http://."""
        registry = self.schema_registry
        if registry == SchemaRegistryClientSettings():
            return self
        url = self.schema_registry_url
        if not url:
            raise ValueError(
                "schema_registry (the registry's login) is set but schema_registry_url is not: "
                "set the URL, or remove the login"
            )
        first = urlsplit(url.split(",")[0].strip())
        if registry.basic_auth_username is not None and (first.username or first.password):
            raise ValueError(
                "the registry's login is given twice: in schema_registry_url (user:password@) "
                "and in schema_registry.basic_auth_*; remove it from the URL"
            )
        tls_files = registry.ssl_ca_location or registry.ssl_certificate_location
        if tls_files and first.scheme != "https":
            raise ValueError(
                "schema_registry.ssl_* settings are used only with an https:// schema_registry_url"
            )
        if registry.bearer_auth is not None and first.scheme != "https":
            raise ValueError(
                "schema_registry.bearer_auth sends access tokens, which never travel in "
                "plaintext: use an https:// schema_registry_url"
            )
        if registry.bearer_auth is not None and (first.username or first.password):
            raise ValueError(
                "the registry's login is given twice: in schema_registry_url (user:password@) "
                "and in schema_registry.bearer_auth; remove it from the URL"
            )
        return self

    @model_validator(mode="after")
    def _security_is_complete(self) -> KafkaSettings:
        """Settings that a client library would reject late, or silently ignore, fail here."""
        sasl = self.security_protocol.startswith("SASL_")
        tls = self.security_protocol in ("SSL", "SASL_SSL")
        if sasl and self.sasl_mechanism is None:
            raise ValueError(
                f"security_protocol {self.security_protocol} needs sasl_mechanism "
                "(PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER)"
            )
        if not sasl and self.sasl_mechanism is not None:
            raise ValueError(
                f"sasl_mechanism {self.sasl_mechanism} needs security_protocol SASL_SSL "
                "(or SASL_PLAINTEXT)"
            )
        if self.sasl_mechanism == "OAUTHBEARER":
            if self.sasl_oauthbearer is None:
                raise ValueError(
                    "sasl_mechanism OAUTHBEARER needs sasl_oauthbearer (token_url, client_id, "
                    "client_secret, scope)"
                )
            if self.sasl_username or self.sasl_password:
                raise ValueError(
                    "sasl_username/sasl_password are not used with OAUTHBEARER: remove them"
                )
        elif self.sasl_mechanism is not None and not (self.sasl_username and self.sasl_password):
            raise ValueError(
                f"sasl_mechanism {self.sasl_mechanism} needs sasl_username and sasl_password"
            )
        if self.sasl_oauthbearer is not None and self.sasl_mechanism != "OAUTHBEARER":
            raise ValueError("sasl_oauthbearer is only used with sasl_mechanism OAUTHBEARER")
        if (self.ssl_certificate_location is None) != (self.ssl_key_location is None):
            raise ValueError(
                "set both ssl_certificate_location and ssl_key_location (mTLS), or neither"
            )
        if self.ssl_key_password is not None and self.ssl_key_location is None:
            raise ValueError("ssl_key_password needs ssl_key_location")
        if not tls and (self.ssl_certificate_location or self.ssl_ca_location):
            raise ValueError(
                f"ssl_* settings are not used with security_protocol {self.security_protocol}: "
                "use SSL (or SASL_SSL)"
            )
        return self


class S3Settings(StrictModel):
    """How to reach the bucket of an ``s3://bucket/prefix`` claim-check URL (AWS S3 or an
    S3-compatible server such as MinIO, Ceph RGW or S3Proxy)."""

    endpoint_url: str | None = Field(
        default=None,
        description="an S3-compatible server, e.g. https://minio.example.com:9000; unset: AWS S3",
    )
    region: str | None = Field(
        default=None, description="e.g. eu-central-1; unset: the AWS_REGION/config default"
    )
    access_key_id: str | None = Field(
        default=None,
        description="unset: boto3's default chain (AWS_* variables, ~/.aws, an instance role)",
    )
    secret_access_key: SecretStr | None = Field(
        default=None, description="with access_key_id (never logged)"
    )
    addressing_style: Literal["auto", "path", "virtual"] = Field(
        default="auto",
        description="bucket in the path or the host name; auto: path with an endpoint_url",
    )
    upload_threads: int = Field(
        default=16, ge=1, le=256, description="a batch's blobs are uploaded this many at a time"
    )
    connect_timeout_seconds: float = Field(default=10.0, gt=0, description="per connection")
    read_timeout_seconds: float = Field(default=60.0, gt=0, description="per request")

    @model_validator(mode="after")
    def _keys_in_pairs(self) -> S3Settings:
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError(
                "set both access_key_id and secret_access_key, or neither (boto3's default chain)"
            )
        return self


class ClientCredentialsSettings(StrictModel):
    """Where and as whom mailtap asks for OAuth2 access tokens (client-credentials grant,
    :mod:`connectors.core.oauth2`)."""

    token_url: str = Field(
        description="the identity provider's token endpoint (https), e.g. "
        "https://login.microsoftonline.com/<tenant>/oauth2/v2.0/token"
    )
    client_id: str = Field(min_length=1, description="the application (client) id")
    client_secret: SecretStr | None = Field(
        default=None,
        description="the application's secret (never logged); or client_secret_file",
    )
    client_secret_file: Path | None = Field(
        default=None,
        description="a file holding the secret instead (a mounted Kubernetes secret), read "
        "when a client is built",
    )
    scope: str = Field(
        description="space-separated; Microsoft 365 IMAP: https://outlook.office365.com/.default"
    )
    ca_file: str | None = Field(
        default=None, description="CA bundle for the token endpoint; the system store if unset"
    )
    timeout_seconds: float = Field(default=30.0, gt=0, description="per token request")

    @field_validator("token_url")
    @classmethod
    def _https(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError("expected an https:// URL (tokens never travel in plaintext)")
        return value

    @model_validator(mode="after")
    def _one_secret(self) -> ClientCredentialsSettings:
        if (self.client_secret is None) == (self.client_secret_file is None):
            raise ValueError("set client_secret or client_secret_file (exactly one)")
        if self.client_secret_file is not None and not self.client_secret_file.is_file():
            raise ValueError(
                f"client_secret_file {self.client_secret_file} does not exist; write the secret "
                "there or fix the path"
            )
        return self

    def secret(self) -> str:
        """The client secret, from the settings or its file (never for a log line)."""
        if self.client_secret is not None:
            return self.client_secret.get_secret_value()
        assert self.client_secret_file is not None  # _one_secret
        return self.client_secret_file.read_text(encoding="utf-8").strip()


class SchemaRegistryClientSettings(StrictModel):
    """How mailtap's registry client (confluent-kafka's ``SchemaRegistryClient``) logs in to
    ``kafka.schema_registry_url``: HTTP basic auth or an OAuth2 bearer token (client
    credentials), the CA that signed the registry's certificate, a client certificate and key
    (mTLS). Secrets are ``SecretStr`` (never logged): :meth:`client_config` reveals them to the
    client itself, :mod:`connectors.core.oauth2` the client secret to the token endpoint."""

    basic_auth_username: str | None = Field(
        default=None, description="HTTP basic auth user (Confluent: an API key), with the password"
    )
    basic_auth_password: SecretStr | None = Field(
        default=None,
        description="HTTP basic auth password (Confluent: the API secret; never logged)",
    )
    ssl_ca_location: str | None = Field(
        default=None, description="CA bundle (PEM) for an https registry; the system store if unset"
    )
    ssl_certificate_location: str | None = Field(
        default=None, description="client certificate (PEM) when the registry asks for one (mTLS)"
    )
    ssl_key_location: str | None = Field(
        default=None, description="the client certificate's private key (PEM)"
    )
    ssl_key_password: SecretStr | None = Field(
        default=None, description="when the private key file is encrypted (never logged)"
    )
    bearer_auth: ClientCredentialsSettings | None = Field(
        default=None,
        description="instead of basic auth: the OIDC token endpoint and the client credentials "
        "mailtap asks it for access tokens with, sent as 'Authorization: Bearer' (refreshed "
        "before they expire); needs an https:// schema_registry_url",
    )
    bearer_auth_logical_cluster: str | None = Field(
        default=None,
        min_length=1,
        description="Confluent Cloud only, with bearer_auth: the registry's logical cluster id "
        "(lsrc-...), sent as target-sr-cluster; leave unset for any other registry",
    )
    bearer_auth_identity_pool_id: str | None = Field(
        default=None,
        min_length=1,
        description="Confluent Cloud only, with bearer_auth: the identity pool id(s) "
        "(pool-..., comma-separated), sent as Confluent-Identity-Pool-Id",
    )

    @model_validator(mode="after")
    def _consistent(self) -> SchemaRegistryClientSettings:
        if (self.basic_auth_username is None) != (self.basic_auth_password is None):
            raise ValueError("set both basic_auth_username and basic_auth_password, or neither")
        if self.bearer_auth is not None and self.basic_auth_username is not None:
            raise ValueError(
                "the registry's login is given twice: set basic_auth_username/basic_auth_password "
                "or bearer_auth, not both"
            )
        confluent_cloud = self.bearer_auth_logical_cluster or self.bearer_auth_identity_pool_id
        if confluent_cloud and self.bearer_auth is None:
            raise ValueError(
                "bearer_auth_logical_cluster and bearer_auth_identity_pool_id are sent with a "
                "bearer token only: set bearer_auth too, or remove them"
            )
        if self.basic_auth_username is not None and ":" in self.basic_auth_username:
            # The client sends "user:password"; a colon in the user would split it elsewhere.
            raise ValueError("basic_auth_username may not contain ':' (RFC 7617)")
        if (self.ssl_certificate_location is None) != (self.ssl_key_location is None):
            raise ValueError(
                "set both ssl_certificate_location and ssl_key_location (mTLS), or neither"
            )
        if self.ssl_key_password is not None and self.ssl_key_location is None:
            raise ValueError("ssl_key_password needs ssl_key_location")
        return self

    def client_config(self) -> dict[str, str]:
        """The ``SchemaRegistryClient`` settings besides ``url``; secrets in clear (for the
        client only, never for a log line)."""
        conf: dict[str, str] = {}
        if self.basic_auth_username is not None and self.basic_auth_password is not None:
            password = self.basic_auth_password.get_secret_value()
            conf["basic.auth.user.info"] = f"{self.basic_auth_username}:{password}"
        if self.ssl_ca_location:
            conf["ssl.ca.location"] = self.ssl_ca_location
        if self.ssl_certificate_location and self.ssl_key_location:
            conf["ssl.certificate.location"] = self.ssl_certificate_location
            conf["ssl.key.location"] = self.ssl_key_location
            if self.ssl_key_password is not None:
                conf["ssl.key.password"] = self.ssl_key_password.get_secret_value()
        return conf


# KafkaSettings.sasl_oauthbearer names ClientCredentialsSettings, defined after it.
KafkaSettings.model_rebuild()


class ParseLimitSettings(StrictModel):
    """Caps applied before parsing (Python's email package is slow on hostile input).

    Mirrors ``connectors.core.mail.limits.ParseLimits``; unset fields keep the parser's defaults.
    The ``limits`` of every source section (``imap``, ``ews``).
    """

    max_message_bytes: int | None = Field(
        default=None, gt=0, description="parser default when unset"
    )
    max_header_bytes: int | None = Field(
        default=None, gt=0, description="parser default when unset"
    )
    max_header_lines: int | None = Field(
        default=None, gt=0, description="parser default when unset"
    )
    max_mime_depth: int | None = Field(default=None, gt=0, description="parser default when unset")
    max_params: int | None = Field(default=None, gt=0, description="parser default when unset")
    max_parts: int | None = Field(default=None, gt=0, description="parser default when unset")
    max_body_bytes: int | None = Field(default=None, gt=0, description="parser default when unset")
    max_attachments: int | None = Field(default=None, gt=0, description="parser default when unset")

    def overrides(self) -> dict[str, int]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class ClaimCheckSettings(StrictModel):
    """Where large bodies, attachments and raw MIME go (referenced from events by URI)."""

    url: str = Field(
        default="file://./.state/claims", description="file:///path or s3://bucket/prefix"
    )
    s3: S3Settings = Field(
        default_factory=S3Settings, description="the bucket's endpoint and credentials (s3://)"
    )
    #: A source's batch appends blobs up to this size to one pack file (one fsync per batch,
    #: instead of a file and an fsync per blob, which cost more than parsing the mail).
    pack_max_blob_bytes: int = Field(
        default=256 * 1024,
        ge=0,
        description="file:// only: blobs up to this size share one pack file per batch; 0: a "
        "file per blob",
    )


class HealthSettings(StrictModel):
    """Metrics and /healthz."""

    host: str = Field(default="127.0.0.1", description="listen address (0.0.0.0 in a container)")
    port: int = Field(default=9108, ge=0, le=65535, description="0 picks a free port")
    max_sync_age_seconds: float = Field(
        default=600.0, gt=0, description="/healthz fails when a mailbox has not synced for longer"
    )


class MailtapConfig(StrictModel):
    """The whole file. Connector sections are kept raw until :meth:`section` validates them."""

    model_config = ConfigDict(extra="allow", frozen=True)

    kafka: KafkaSettings
    claim_check: ClaimCheckSettings = ClaimCheckSettings()
    health: HealthSettings = HealthSettings()
    source_path: str | None = None
    #: ``{dotted key path: MAILTAP__ variable}`` of the overrides applied, for error messages.
    _env_sources: dict[str, str] = PrivateAttr(default_factory=dict)
    #: Connector sections with their :class:`EnvText` values untyped, for :meth:`section`.
    _env_sections: dict[str, Any] = PrivateAttr(default_factory=dict)

    def section(self, name: str, model: type[M]) -> M:
        """Validate the raw section ``name`` with ``model``; errors name the full key path."""
        raw = (self.model_extra or {}).get(name)
        if raw is None:
            raise ConfigError(missing_section(name, self.model_extra or {}, self._where()))
        # The section as merged, its environment values still text: typed by this model.
        raw = typed_env_values(self._env_sections.get(name, raw), model)
        try:
            return model.model_validate(raw, context={ns.CONTEXT_KEY: self.kafka.namespace})
        except ValidationError as exc:
            raise ConfigError(
                describe(exc, prefix=name, where=self._where(), model=model, env=self._env_sources)
            ) from None

    def has_section(self, name: str) -> bool:
        return (self.model_extra or {}).get(name) is not None

    def _where(self) -> str:
        return self.source_path or "configuration"


class EnvText(str):
    """The text of a ``MAILTAP__`` variable, not typed yet: :func:`typed_env_values` gives it
    the type of the field it lands in once the field's model is known (a connector's section
    is known only to the connector)."""

    __slots__ = ()


def env_bootstrap_servers(env: Mapping[str, str]) -> str | None:
    """The Kafka bootstrap servers the environment names, if any: ``MAILTAP_KAFKA_BOOTSTRAP`` or
    its alias ``MAILTAP__KAFKA__BOOTSTRAP_SERVERS`` (both set: they must agree).

    >>> env_bootstrap_servers({"MAILTAP__KAFKA__BOOTSTRAP_SERVERS": "b:2"})
    'b:2'
    """
    short = env.get(ENV_KAFKA_BOOTSTRAP) or None
    generic = env.get(ENV_KAFKA_BOOTSTRAP_GENERIC) or None
    if short and generic and short != generic:
        raise ConfigError(
            f"{ENV_KAFKA_BOOTSTRAP}={short} and {ENV_KAFKA_BOOTSTRAP_GENERIC}={generic} both set "
            f"kafka.bootstrap_servers, to different values: unset one "
            f"({ENV_KAFKA_BOOTSTRAP} is the documented one)"
        )
    return short or generic


def apply_env_overrides(raw: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """Return ``raw`` with ``MAILTAP__A__B=v`` and ``MAILTAP_KAFKA_BOOTSTRAP`` applied; a number
    indexes an existing list entry (``MAILTAP__IMAP__ACCOUNTS__0__PASSWORD``). The values are
    :class:`EnvText`, typed by :func:`typed_env_values`.

    >>> apply_env_overrides({"kafka": {"bootstrap_servers": "a:1"}},
    ...                     {"MAILTAP__HEALTH__PORT": "9100", "MAILTAP_KAFKA_BOOTSTRAP": "b:2"})
    {'kafka': {'bootstrap_servers': 'b:2'}, 'health': {'port': '9100'}}
    """
    merged: dict[str, Any] = {k: v for k, v in raw.items()}
    for name, value in sorted(env.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__") if p]
        if not path or _indexes_a_missing_list(merged, path):
            continue
        node: Any = merged
        for part, after in pairwise(path):
            child = _child(node, part)
            # A number after a list is an index (MAILTAP__IMAP__ACCOUNTS__0__PASSWORD): a
            # credential of one list entry comes from the environment, the rest from the file.
            is_list = isinstance(child, list) and after.isdigit()
            child = list(child) if is_list else dict(child) if isinstance(child, Mapping) else {}
            _set(node, part, child)
            node = child
        _set(node, path[-1], EnvText(value))
    bootstrap = env_bootstrap_servers(env)
    if bootstrap:
        kafka = dict(merged.get("kafka") or {})
        kafka["bootstrap_servers"] = bootstrap
        merged["kafka"] = kafka
    return merged


#: Types whose value is text: an environment variable sets them to its text, unparsed.
_TEXT_TYPES: tuple[type, ...] = (str, SecretStr, Path, re.Pattern)
#: Scalars pydantic parses from text by itself (``"0777"`` -> 777, ``"yes"`` -> True).
_SCALAR_TYPES: tuple[type, ...] = (int, float, bool, type(None))
_NULLS = frozenset({"null", "Null", "NULL", "~"})


def typed_env_values(value: Any, annotation: Any) -> Any:
    """``value`` with each :class:`EnvText` in it given the type of the field it sets.

    ``annotation`` is the type of ``value`` (a settings model for a section). A string field
    takes the text literally: YAML would read ``pass #1`` as ``pass`` (a comment), ``0777`` as
    511 (an octal number) and refuse ``!x`` (a tag), and the wrong password would be sent
    without a word. Numbers and bools go to the model as text, which pydantic parses strictly
    (``0777`` is 777, ``abc`` an error naming the key); lists, mappings and fields of unknown
    type (``Any``) are read as YAML, as every value was before. ``null`` and ``~`` unset an
    optional field of any type (``MAILTAP__KAFKA__SCHEMA_REGISTRY_URL=null``): an optional
    secret spelled exactly so is not worth losing the only way to unset a key.

    >>> from pydantic import BaseModel
    >>> class Account(BaseModel):
    ...     password: SecretStr
    ...     port: int
    ...     folders: list[str] = []
    >>> typed_env_values({"password": EnvText("0777 #1"), "port": EnvText("0993"),
    ...                   "folders": EnvText("[INBOX, Sent]")}, Account)
    {'password': '0777 #1', 'port': '0993', 'folders': ['INBOX', 'Sent']}
    """
    if isinstance(value, EnvText):
        return _typed_text(str(value), annotation)
    if isinstance(value, dict):
        model = _model_in(annotation)
        if model is None:
            item = _item_type(annotation, mapping=True)
            return {k: typed_env_values(v, item) for k, v in value.items()}
        return {k: _typed_field(model, str(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        item = _item_type(annotation, mapping=False)
        return [typed_env_values(v, item) for v in value]
    return value


def _typed_field(model: type[BaseModel], key: str, value: Any) -> Any:
    field = model.model_fields.get(key) or next(
        (f for f in model.model_fields.values() if f.alias == key), None
    )
    if field is not None:
        return typed_env_values(value, field.annotation)
    if model.model_config.get("extra") == "allow":
        return value  # a connector's section: typed by its own model in MailtapConfig.section
    return typed_env_values(value, Any)  # an unknown key: the model will name it


def _members(annotation: Any) -> list[Any]:
    """``Annotated[X | None, ...]`` -> ``[X, NoneType]``."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _members(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [m for arg in get_args(annotation) for m in _members(arg)]
    return [annotation]


def _is_text(member: Any) -> bool:
    if get_origin(member) is Literal:
        return any(isinstance(arg, str) for arg in get_args(member))
    return isinstance(member, type) and issubclass(member, _TEXT_TYPES)


def _typed_text(text: str, annotation: Any) -> Any:
    members = _members(annotation)
    if text in _NULLS and type(None) in members:
        return None  # the one way to unset an optional key from the environment
    if not text or any(_is_text(m) for m in members):
        return text
    if all(isinstance(m, type) and issubclass(m, _SCALAR_TYPES) for m in members):
        return text
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text  # the model says what it expected


def _model_in(annotation: Any) -> type[BaseModel] | None:
    for member in _members(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            return member
    return None


def _item_type(annotation: Any, *, mapping: bool) -> Any:
    """The value type of ``dict[str, X]`` (``mapping``) or of ``list[X]`` / ``tuple[X, ...]``."""
    for member in _members(annotation):
        args = get_args(member)
        origin = get_origin(member)
        if mapping and origin is dict and len(args) == 2:
            return args[1]
        if not mapping and origin in (list, tuple, set, frozenset) and args:
            return args[0]
    return Any


def _indexes_a_missing_list(merged: dict[str, Any], path: list[str]) -> bool:
    """True for ``MAILTAP__EWS__ACCOUNTS__0__PASSWORD`` when the file has no ``ews.accounts``.

    List entries come from the file; such a variable belongs to another file read with the
    same environment (compose gives every service one env file; the Exchange source has its own
    config file), so it is not applied here. An index past the end of a list the file *has*
    stays an error (:func:`_set`).
    """
    node: Any = merged
    for depth, part in enumerate(path[:-1]):
        if not isinstance(node, (dict, list)):
            return False
        node = _child(node, part)
        if node is None:  # from here on the variable creates what it names
            return any(p.isdigit() for p in path[depth + 1 :])
    return False


def _child(node: dict[str, Any] | list[Any], part: str) -> Any:
    if isinstance(node, list):
        return node[int(part)] if int(part) < len(node) else None
    return node.get(part)


def _set(node: dict[str, Any] | list[Any], part: str, value: Any) -> None:
    if not isinstance(node, list):
        node[part] = value
    elif int(part) < len(node):
        node[int(part)] = value
    else:
        raise ConfigError(
            f"environment override index {part} is past the end of a list of {len(node)} "
            f"entries; add the entry to the file first"
        )


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> MailtapConfig:
    """Read, merge environment overrides, validate. Raises ConfigError with a fix-it sentence."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(
            f"config file {file} does not exist; pass -c with the path of a YAML file"
        )
    try:
        raw = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{file}: the top level must be a mapping of sections (kafka:, imap:, ...)"
        )
    # Settings files of MAILTAP_SECRETS_DIR (compose/Kubernetes secrets) as if variables.
    environment = with_secret_files(os.environ if env is None else env)
    return config_from_dict(raw, env=environment, source=str(file))


def config_from_dict(
    raw: Mapping[str, Any], *, env: Mapping[str, str] | None = None, source: str | None = None
) -> MailtapConfig:
    merged = apply_env_overrides(dict(raw), env or {})
    if "kafka" not in merged:
        if closest("kafka", merged) is not None:
            raise ConfigError(missing_section("kafka", merged, source or "configuration"))
        raise ConfigError(
            f"{source or 'configuration'}: section 'kafka' is missing; add kafka.bootstrap_servers "
            f"or set {ENV_KAFKA_BOOTSTRAP}"
        )
    sources = env_sources(env or {})
    # Connector sections stay untyped until their owner's model types them (section()); what
    # reads a section raw (retry tiers, app ids) sees YAML-read values, as before.
    typed = typed_env_values(merged, MailtapConfig)
    untyped = {k: v for k, v in merged.items() if k not in MailtapConfig.model_fields}
    typed.update({k: typed_env_values(v, Any) for k, v in untyped.items()})
    try:
        config = MailtapConfig.model_validate({**typed, "source_path": source})
    except ValidationError as exc:
        raise ConfigError(
            describe(
                exc, prefix="", where=source or "configuration", model=MailtapConfig, env=sources
            )
        ) from None
    config._env_sources = sources
    config._env_sections = untyped
    return config
