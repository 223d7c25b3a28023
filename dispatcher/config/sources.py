"""Where a configuration comes from: the YAML file, the environment, or Knative's variables.

Loading is two steps so every source feeds the same validation: something
builds a raw ``dict`` (the YAML file, or in Knative drop-in mode the Knative
dispatcher's variables, ``knative``), then ``settings_from_dict`` applies the
environment overrides (``RABBITMQ_URL``, ``DEDUPE_STORE_URL``,
``DISPATCHER_LISTEN``, ``LOG_LEVEL``, ``LOG_FORMAT``, and OpenTelemetry's
``OTEL_*``: ``otel``) and validates the result
(``rules``). A ``ConfigError`` about a value that came from a variable names
the variable, not the key: the user has to fix that, not the file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from dispatcher.config import knative, otel
from dispatcher.config.problems import blamed, config_error
from dispatcher.config.redaction import redact_text, show
from dispatcher.config.settings import BatchSettings, Settings
from dispatcher.errors import ConfigError

DEFAULT_CONFIG_PATH: Final = "config/dispatcher.yaml"

Shape = TypeVar("Shape", bound=BaseModel)

# (variable, section, key): applied after the file, before validation, so a
# Kubernetes Secret can supply the broker URL without touching the file.
_ENV_OVERRIDES: Final = (
    ("RABBITMQ_URL", "broker", "url"),
    ("DEDUPE_STORE_URL", "dedupe", "store"),
    ("DISPATCHER_LISTEN", "http", "listen"),
    ("LOG_LEVEL", "logging", "level"),
    ("LOG_FORMAT", "logging", "format"),
)


def load_settings(
    path: str | None,
    environ: Mapping[str, str],
    resolve: Callable[[Settings], object] | None = None,
) -> Settings:
    """Read the config file (``path``, else ``$DISPATCHER_CONFIG``, else the default).

    With no config file at all and ``QUEUE_NAME`` set, build one binding from
    the Knative dispatcher's variables instead (``knative``).

    ``resolve`` reads what the result names with the libraries this package does
    not import (``dispatcher.resolve``: pika, ssl, libcurl's proxies, redis-py);
    its ConfigErrors name a variable the value came from, like the package's own.
    """
    resolved, named_by = _resolve_config_path(path, environ)
    if named_by == "config" and not path and knative.wanted(environ, os.path.exists(resolved)):
        # raw_config has applied RABBITMQ_URL already (with RABBITMQ_VHOST):
        # applying it again would drop that vhost.
        rest = {k: v for k, v in environ.items() if k != "RABBITMQ_URL"}
        origins = knative.origins(environ)
        return settings_from_dict(knative.raw_config(environ), rest, origins, resolve)
    raw = _read_yaml(resolved, named_by)
    return settings_from_dict(raw, environ, resolve=resolve)


def load_batch_settings(
    path: str | None,
    environ: Mapping[str, str],
    sections: tuple[str, ...] = ("broker", "logging"),
    resolve: Callable[[BatchSettings], object] | None = None,
) -> BatchSettings:
    """The ``broker`` and ``logging`` sections alone, for the batch commands: only
    those of ``sections`` are read and checked (``report`` never connects to a
    broker, so a broker setting it cannot use must not stop it); the others keep
    their defaults.

    They read the same file as the service when there is one (bindings are not
    needed, so not required), else the defaults; the environment overrides
    either (``RABBITMQ_URL``, ``LOG_LEVEL``, ``LOG_FORMAT``), as for the service.
    """
    resolved, named_by = _resolve_config_path(path, environ)
    raw: Mapping[str, object] = {}
    if path or named_by != "config" or os.path.exists(resolved):
        raw = _read_yaml(resolved, named_by)
    merged, origins = _apply_env_overrides({name: raw.get(name) for name in sections}, environ)
    wanted = {name: merged[name] for name in sections if name in merged}
    settings = _validated(BatchSettings, wanted, origins)
    with _blaming_variables(origins):
        if resolve is not None:
            resolve(settings)
        return settings


def settings_from_dict(
    raw: Mapping[str, object],
    environ: Mapping[str, str],
    origins_of_raw: Mapping[str, str] | None = None,
    resolve: Callable[[Settings], object] | None = None,
) -> Settings:
    """Apply the environment overrides to ``raw`` and validate the result.

    ``origins_of_raw`` maps key paths to the variables they came from, when
    ``raw`` itself was built from the environment, so errors name those.
    """
    merged, origins = _apply_env_overrides(raw, environ)
    origins = {**(origins_of_raw or {}), **origins}
    settings = _validated(Settings, merged, origins)
    with _blaming_variables(origins):
        if settings.tracing.enabled:
            otel.traces_url(settings.tracing, environ)  # a bad signal endpoint: refused now
        if resolve is not None:
            resolve(settings)
        return settings


def _validated(shape: type[Shape], raw: Mapping[str, object], origins: Mapping[str, str]) -> Shape:
    try:
        return shape.model_validate(raw)
    except ValidationError as err:
        raise config_error(err, shape, origins) from None


@contextmanager
def _blaming_variables(origins: Mapping[str, str]) -> Iterator[None]:
    """A ConfigError about a key that came from a variable names the variable:
    the user has to fix that, not the file."""
    try:
        yield
    except ConfigError as err:
        key = blamed(err.key, origins)
        if key == err.key:
            raise
        raise ConfigError(key, err.problem) from None


def _resolve_config_path(path: str | None, environ: Mapping[str, str]) -> tuple[str, str]:
    """Return the path and what chose it, so "file not found" can blame the right thing."""
    if path:
        return path, "config"
    from_env = environ.get("DISPATCHER_CONFIG")
    if from_env:
        return from_env, "DISPATCHER_CONFIG"
    return DEFAULT_CONFIG_PATH, "config"


def _read_yaml(path: str, named_by: str) -> Mapping[str, object]:
    try:
        with open(path, "rb") as stream:
            data = stream.read()
    except FileNotFoundError:
        raise ConfigError(named_by, f"file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(named_by, f"is a directory, not a file: {path}") from None
    except OSError as err:
        raise ConfigError(named_by, f"cannot read {path}: {err.strerror}") from None
    try:
        # Bytes, not text: lets PyYAML honour a UTF-16 BOM as the YAML spec says.
        document = yaml.load(data, Loader=_StrictLoader)
    except yaml.YAMLError as err:
        raise ConfigError("config", f"invalid YAML in {path}{_yaml_where(err)}") from None
    except (ValueError, KeyError, RecursionError) as err:
        # PyYAML's constructors raise these, not a YAMLError, for a value its
        # explicit tag cannot read (`!!bool maybe`, `!!int x`, `!!timestamp
        # 2026-13-01`) and for collections nested deeper than Python's stack.
        what = "nested too deep" if isinstance(err, RecursionError) else "a tagged value"
        raise ConfigError(
            "config", f"invalid YAML in {path}: {what} cannot be read ({_show_error(err)})"
        ) from None
    if document is None:
        raise ConfigError("config", f"{path} is empty")
    if not isinstance(document, Mapping):
        raise ConfigError("config", f"{path}: top level must be a mapping, got {show(document)}")
    return document


def _show_error(err: BaseException) -> str:
    return redact_text(f"{type(err).__name__}: {err}")[:200]


def _yaml_where(err: yaml.YAMLError) -> str:
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        problem = err.problem or "syntax error"
        where = f" at line {mark.line + 1}, column {mark.column + 1}: {problem}"
    else:
        where = f": {err}"
    return redact_text(where)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys, which PyYAML silently collapses."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            # Merge keys (``<<: *defaults``) may legitimately be overridden.
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def blame_variables(error: ConfigError, environ: Mapping[str, str]) -> ConfigError:
    """``error`` naming the variable its key came from, for errors found after the
    settings were built (the service's listen address taken, say)."""
    _merged, origins = _apply_env_overrides({}, environ)
    key = blamed(error.key, origins)
    return error if key == error.key else ConfigError(key, error.problem)


def _apply_env_overrides(
    raw: Mapping[str, object], environ: Mapping[str, str]
) -> tuple[dict[str, object], dict[str, str]]:
    """Return the merged raw config and which key paths came from which variable."""
    merged = dict(raw)
    origins: dict[str, str] = {}
    for variable, section, key in _ENV_OVERRIDES:
        value = environ.get(variable)
        # Empty counts as unset: manifests often render an optional variable as "".
        if not value:
            continue
        current = merged.get(section)
        if current is None:
            current = {}
        if not isinstance(current, Mapping):
            continue  # validation reports the file's malformed section as it is
        merged[section] = {**current, key: value}
        origins[f"{section}.{key}"] = variable
    keys, tracing_origins = otel.overrides(environ)
    current = merged.get("tracing") or {}
    if keys and isinstance(current, Mapping):
        merged["tracing"] = {**current, **keys}
        origins.update(tracing_origins)
    return merged, origins
