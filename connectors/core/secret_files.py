"""Settings read from files: ``MAILTAP_SECRETS_DIR`` names a directory whose files named after a
``MAILTAP__`` variable set that variable, the file's content its value.

This is how compose secrets and Kubernetes Secret volumes hand a credential to a container: a
file under ``/run/secrets``, never an environment variable (which ``podman inspect`` and
``/proc/<pid>/environ`` show). The directory follows pydantic-settings' ``secrets_dir`` (one
file per setting, named as its environment variable) so that any setting can come from a
file, not only those with a ``*_file`` twin; the values then go through the same typing as
the environment's (:func:`connectors.core.config.typed_env_values`)::

    /run/secrets/MAILTAP__KAFKA__SASL_PASSWORD      -> kafka.sasl_password
    /run/secrets/MAILTAP__KAFKA__SSL_KEY_PASSWORD   -> kafka.ssl_key_password

Files with other names (``console-tokens.yaml``, Kubernetes' ``..data``) are not settings and
are left alone. One line ending at the end of a file is dropped (``echo pw > file`` writes one);
anything else is the value as written. A variable set both in the environment and by a file is
an error: silently preferring one would let a shared env file's login override a component's
own.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from connectors.core.errors import ConfigError

ENV_SECRETS_DIR = "MAILTAP_SECRETS_DIR"
#: Only files named like the environment overrides are settings.
SETTING_PREFIX = "MAILTAP__"


def secret_file_values(env: Mapping[str, str]) -> dict[str, str]:
    """``{variable: value}`` of the setting files in ``env[MAILTAP_SECRETS_DIR]`` (none when unset).

    Raises ConfigError when the directory or one of its setting files cannot be read.
    """
    folder = env.get(ENV_SECRETS_DIR)
    if not folder:
        return {}
    directory = Path(folder)
    if not directory.is_dir():
        raise ConfigError(
            f"{ENV_SECRETS_DIR}={folder} is not a directory: mount the secrets there, or unset "
            f"{ENV_SECRETS_DIR}"
        )
    values: dict[str, str] = {}
    for path in sorted(directory.iterdir()):
        if not path.name.startswith(SETTING_PREFIX) or path.is_dir():
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except OSError as exc:
            raise ConfigError(
                f"cannot read the setting file {path} ({exc.strerror}): the container's user "
                "must be allowed to read it"
            ) from None
        except UnicodeDecodeError:
            raise ConfigError(f"the setting file {path} is not UTF-8 text") from None
        values[path.name] = text.removesuffix("\n").removesuffix("\r")
    return values


def with_secret_files(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the values of :func:`secret_file_values` added.

    >>> with_secret_files({"MAILTAP__HEALTH__PORT": "9100"})
    {'MAILTAP__HEALTH__PORT': '9100'}
    """
    files = secret_file_values(env)
    both = sorted(name for name in files if name in env)
    if both:
        raise ConfigError(
            f"{', '.join(both)} set both in the environment and by a file of "
            f"{ENV_SECRETS_DIR} ({env[ENV_SECRETS_DIR]}): remove one (a shared env file must "
            "not hold the setting a service's own secret gives)"
        )
    return {**env, **files}
