"""The effective configuration: what ``dispatcher check`` prints.

Every setting, defaults included, written back in the notation of the file
(``250ms``, ``8MiB``, mappings for headers and filters), with URL passwords
and secret-looking header values hidden. A field's ``render`` metadata
(``settings``) says how its value is written.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from typing import TYPE_CHECKING, Any, Final

import yaml

from dispatcher.config.redaction import redact_url
from dispatcher.config.settings import CesqlFilter, FilterEntry, MatchFilter, Settings

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# The reference documentation lists `declare` before `subscriber`; dataclass
# field order cannot, because required fields must come first.
_BINDING_KEY_ORDER: Final = (
    "name",
    "queue",
    "declare",
    "subscriber",
    "content_mode",
    "tls",
    "parallelism",
    "prefetch",
    "ordered",
    "delivery",
    "circuit_breaker",
    "auth",
    "headers",
    "filter",
    "filters",
    "dedupe_window",
    "dead_letter",
    "reply",
    "non_cloudevent",
    "max_body_size",
)


def effective_config(settings: Settings) -> dict[str, object]:
    """Every setting as plain data, in the file's own notation, passwords redacted."""
    effective = _plain(settings)
    effective["bindings"] = [
        {key: binding[key] for key in _BINDING_KEY_ORDER}
        for binding in (_plain(b) for b in settings.bindings)
    ]
    return effective


def render_effective_config(settings: Settings) -> str:
    """``effective_config`` as YAML, keys in the documented order."""
    return yaml.safe_dump(
        effective_config(settings), sort_keys=False, default_flow_style=False, allow_unicode=True
    )


def _plain(obj: DataclassInstance) -> dict[str, object]:
    plain: dict[str, object] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        plain[f.name] = _render(value, f.metadata.get("render"))
    return plain


def _render(value: object, how: str | None) -> object:
    if how in _WHOLE:  # a tuple shown as a whole, as it was written
        return _RENDERERS[how](value)
    if is_dataclass(value) and not isinstance(value, type):
        return _plain(value)
    if isinstance(value, tuple):
        return [_render(item, how) for item in value]
    render = _RENDERERS.get(how or "")
    return value if render is None or value is None else render(value)


_SECRET_HEADER: Final = re.compile(r"auth|token|secret|key|password|cookie|signature", re.I)


def _render_header(name: str, value: str) -> str:
    """``check`` shows header values, except those whose name says they are secret."""
    return "<redacted>" if _SECRET_HEADER.search(name) else value


def _render_filter(entry: FilterEntry) -> dict[str, object]:
    if isinstance(entry, MatchFilter):
        return {entry.dialect: dict(entry.attributes)}
    if isinstance(entry, CesqlFilter):
        return {"cesql": entry.expression}
    if entry.dialect == "not":
        return {"not": _render_filter(entry.filters[0])}
    return {entry.dialect: [_render_filter(nested) for nested in entry.filters]}


def _render_duration(seconds: float) -> str | float:
    millis = round(seconds * 1000)
    if not math.isclose(millis, seconds * 1000, rel_tol=0, abs_tol=1e-6):
        return seconds  # not a whole number of milliseconds: plain seconds is exact
    if millis == 0:
        return "0s"
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if millis % size == 0:
            return f"{millis // size}{unit}"
    return f"{millis}ms"


def _render_size(size: int) -> str | int:
    for unit, factor in (("MiB", 1024**2), ("KiB", 1024)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return size


_RENDERERS: Final[Mapping[str, Callable[[Any], object]]] = {
    "duration": _render_duration,
    "url": redact_url,
    "size": _render_size,
    "number": lambda number: int(number) if number.is_integer() else number,
    "headers": lambda pairs: {name: _render_header(name, value) for name, value in pairs},
    "mapping": dict,
    "filters": lambda entries: [_render_filter(entry) for entry in entries],
}
_WHOLE: Final = frozenset({"headers", "mapping", "filters"})
