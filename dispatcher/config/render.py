"""The effective configuration: what ``dispatcher check`` prints.

Every setting, defaults included, written back in the notation of the file
(``250ms``, ``8MiB``, mappings for headers and filters), with URL passwords
and secret-looking header values hidden. A key's ``Accepts`` marker
(``settings``) says how its value is written.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, get_args

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from dispatcher.config.filter_tree import CesqlFilter, FilterEntry, MatchFilter
from dispatcher.config.redaction import redact_url
from dispatcher.config.settings import Settings
from dispatcher.config.validation import Accepts


def effective_config(settings: Settings) -> dict[str, object]:
    """Every setting as plain data, in the file's own notation, passwords redacted."""
    return _plain(settings)


def render_effective_config(settings: Settings) -> str:
    """``effective_config`` as YAML, keys in the documented order."""
    return yaml.safe_dump(
        effective_config(settings), sort_keys=False, default_flow_style=False, allow_unicode=True
    )


def _plain(section: BaseModel) -> dict[str, object]:
    shape = type(section).model_fields
    return {name: _render(getattr(section, name), _how(f)) for name, f in shape.items()}


def rendered_default(field: FieldInfo) -> object:
    """A key's default as ``check`` writes it (``200ms``, ``8MiB``)."""
    value = field.get_default(call_default_factory=True)
    return _render(value, _how(field))


def _how(field: FieldInfo) -> str | None:
    marked = next((m.render for m in field.metadata if isinstance(m, Accepts)), None)
    if marked is None and _holds_float(field.annotation):
        return "number"  # 1.0 written as 1, as the user would
    return marked


def _holds_float(annotation: object) -> bool:
    if annotation is float:
        return True
    return any(_holds_float(arg) for arg in get_args(annotation) if arg is not type(None))


def _render(value: object, how: str | None) -> object:
    if how in _WHOLE:  # a tuple shown as a whole, as it was written
        return _RENDERERS[how](value)
    if isinstance(value, BaseModel):
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
