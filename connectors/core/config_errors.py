"""Configuration errors as sentences that say what to change: the key's full path, a "did you
mean" for a misspelled key or section, and the environment variable when the value came from one
(``MAILTAP__SMTP__PORTT=1`` is not in the YAML file, so the file must not be blamed).

    smtp.portt: Extra inputs are not permitted (an unknown key); did you mean 'port'? (set by the
      environment variable MAILTAP__SMTP__PORTT; did you mean MAILTAP__SMTP__PORT?)
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

ENV_PREFIX = "MAILTAP__"


def env_path(name: str) -> str | None:
    """The dotted key path a ``MAILTAP__A__B`` variable sets (``a.b``), or None.

    >>> env_path("MAILTAP__SMTP__PORTT"), env_path("HOME")
    ('smtp.portt', None)
    """
    if not name.startswith(ENV_PREFIX):
        return None
    parts = [p.lower() for p in name[len(ENV_PREFIX) :].split("__") if p]
    return ".".join(parts) or None


def env_sources(env: Mapping[str, str]) -> dict[str, str]:
    """``{dotted path: variable name}`` of every override in ``env``."""
    return {path: name for name in env if (path := env_path(name)) is not None}


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The likely intended spelling, or None when nothing is close.

    >>> closest("portt", ["host", "port", "security"]), closest("zzz", ["port"])
    ('port', None)
    """
    found = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def _nested(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The model inside an annotation, and whether its loc has one extra part (index or dict key)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin = typing.get_origin(annotation)
    models = [
        a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)
    ]
    if len(models) != 1:
        return None, False
    if origin in (list, tuple, set, frozenset, dict):
        return models[0], True
    if origin in (typing.Union, types.UnionType):
        return models[0], False
    return None, False


def keys_at(model: type[BaseModel] | None, loc: Sequence[str | int]) -> list[str]:
    """The keys a mapping at ``loc`` (inside ``model``) accepts; [] when unknown."""
    current = model
    skip = False
    for part in loc:
        if skip:
            skip = False
            continue
        if current is None:
            return []
        fields = {f.alias or name: f for name, f in current.model_fields.items()}
        field = fields.get(str(part))
        if field is None:
            return []
        current, skip = _nested(field.annotation)
    if current is None:
        return []
    return [f.alias or name for name, f in current.model_fields.items()]


def _path(prefix: str, loc: Sequence[str | int]) -> str:
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path = f"{path}[{part}]"
        else:
            path = f"{path}.{part}" if path else str(part)
    return path


def _env_var_of(path: str, sources: Mapping[str, str]) -> str | None:
    dotted = path.replace("[", ".").replace("]", "")
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        name = sources.get(".".join(parts[:end]))
        if name is not None:
            return name
    return None


def describe(
    exc: ValidationError,
    *,
    prefix: str,
    where: str,
    model: type[BaseModel] | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """One line per error: path, problem, what was given (scalars only, never a secret), a
    suggestion for an unknown key, and the environment variable that set the value."""
    sources = env or {}
    lines = []
    from_env = 0
    for err in exc.errors():
        loc = [p for p in err["loc"] if isinstance(p, (str, int))]
        path = _path(prefix, loc)
        got = err.get("input")
        variable = _env_var_of(path, sources)
        if err["type"] == "extra_forbidden":
            key = str(loc[-1]) if loc else path
            guess = closest(key, keys_at(model, loc[:-1]))
            text = f"{path}: {err['msg']} (an unknown key)" + (
                f"; did you mean {guess!r}?" if guess else ""
            )
        else:
            # Only scalars are echoed: a list or mapping may carry a password (an accounts list).
            scalar = isinstance(got, (str, int, float, bool)) and len(repr(got)) < 200
            secret = any(word in path for word in ("password", "secret", "token", "key"))
            shown = f" (got {got!r})" if scalar and not secret else ""
            text = f"{path}: {err['msg']}{shown}"
            guess = None
        if variable is not None:
            from_env += 1
            hint = ""
            if guess is not None and variable.count("__") >= 2:
                hint = f"; did you mean {variable.rsplit('__', 1)[0]}__{guess.upper()}?"
            text += f" (set by the environment variable {variable}{hint})"
        lines.append(text)
    if from_env == len(lines):
        head = f"invalid configuration from the environment (on top of {where})"
    else:
        head = f"{where}: invalid configuration"
    return f"{head}:\n  " + "\n  ".join(lines)


def missing_section(name: str, present: Iterable[str], where: str) -> str:
    """``section 'smtp' is missing``, with the misspelled section that is there instead."""
    guess = closest(name, [p for p in present if p != name])
    if guess is not None:
        return (
            f"{where}: section '{name}' is missing, but there is a section '{guess}': "
            f"did you mean '{name}'? Rename '{guess}:' to '{name}:'"
        )
    return (
        f"{where}: section '{name}' is missing; add a '{name}:' mapping (see README, Configuration)"
    )
