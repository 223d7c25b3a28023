"""pydantic's errors in our words: every problem of a file, each naming its key.

pydantic reports a location (``("bindings", 0, "delivery", "retry")``) and an
error type; users read ``bindings[0].delivery.retry: must be >= 0``. Our own
parsers' problems (``validation``) come with their words and the part of the
key they add (``[2]``, ``.Authorization``); pydantic's own are a missing key
(``required``) and an unknown one (the section's keys listed). A key whose
value came from an environment variable is named by the variable: the user has
to fix that, not the file. An input value appears only through ``show``
(URL passwords redacted, long text cut, containers by kind), never as
pydantic would echo it.
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping
from typing import Annotated, Any, Final, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from dispatcher.config.redaction import show
from dispatcher.config.validation import ERROR_TYPE
from dispatcher.config.values import written
from dispatcher.errors import ConfigError

# A missing key whose problem says more than "required".
_REQUIRED: Final[Mapping[str, str]] = {"bindings": "required: list at least one binding"}


def config_error(
    error: ValidationError, root: type[BaseModel], origins: Mapping[str, str]
) -> ConfigError:
    """Every problem of ``error`` as one ConfigError: in declaration order, an
    unknown key first in its section (a misspelt key explains a missing one)."""
    found: list[tuple[tuple[str | int, ...], bool, tuple[str, str]]] = []
    for details in error.errors(include_url=False):
        loc, unknown = details["loc"], details["type"] == "extra_forbidden"
        key, problem = _problem(details, root)
        entry = (loc, unknown, (blamed(key, origins), problem))
        at = len(found)
        if unknown:
            section = loc[:-1]
            at = next(
                (
                    i
                    for i, (other, was_unknown, _) in enumerate(found)
                    if other[: len(section)] == section
                    and not (was_unknown and other[:-1] == section)
                ),
                at,
            )
        found.insert(at, entry)
    problems: list[tuple[str, str]] = []
    for _, _, said in found:
        if said not in problems:
            problems.append(said)
    (key, problem), *more = problems
    return ConfigError(key, problem, more)


def blamed(key: str, origins: Mapping[str, str]) -> str:
    """``key``, or the variable its value came from (``broker.url[1]`` came from
    RABBITMQ_URL too: its second node)."""
    return origins.get(key) or origins.get(re.sub(r"\[[0-9]+\]$", "", key)) or key


def _problem(details: Any, root: type[BaseModel]) -> tuple[str, str]:
    loc: tuple[str | int, ...] = details["loc"]
    kind = details["type"]
    if kind == ERROR_TYPE:
        ctx = details["ctx"]
        return _joined(_path(loc), ctx["rest"]), ctx["problem"]
    if kind == "missing":
        return _path(loc), _REQUIRED.get(str(loc[-1]), "required")
    if kind == "extra_forbidden":
        allowed = ", ".join(sorted(_section_at(root, loc[:-1]).model_fields))
        key = _joined(_path(loc[:-1]), written(str(loc[-1])))
        return key, f"unknown key (expected one of: {allowed})"
    return _path(loc) or "config", _plain_problem(details, root)


def _plain_problem(details: Any, root: type[BaseModel]) -> str:
    """A strict pydantic type's error (a boolean, a bounded number, a string, one
    of a few words) as our messages have always said it. The input is shown
    redacted (``show``), never as pydantic would."""
    kind, value = details["type"], details.get("input")
    if kind in _SIMPLE:
        return _SIMPLE[kind]
    if kind == "float_type" and isinstance(value, int) and not isinstance(value, bool):
        return "must be a finite number"  # an integer beyond any float
    if kind in _GOT:
        return f"{_GOT[kind]}, got {show(value)}"
    return _out_of_bounds(details, root)


def _out_of_bounds(details: Any, root: type[BaseModel]) -> str:
    kind, ctx, value = details["type"], details.get("ctx", {}), details.get("input")
    if kind == "literal_error":
        words = re.findall(r"'([^']*)'", ctx["expected"])
        return f"must be one of {', '.join(words)}, got {show(value)}"
    if kind in ("greater_than_equal", "less_than_equal"):
        low, high = _bounds(root, details["loc"])
        if low is not None and high is not None and isinstance(value, int):
            return f"must be between {low} and {high}"
        bound = ctx.get("ge", ctx.get("le"))
        return f"must be {'>=' if kind == 'greater_than_equal' else '<='} {bound:g}"
    if kind == "greater_than":
        return f"must be > {ctx['gt']:g}"
    # Not reached by a file: every key's type is one of the above or has a parser of ours.
    return str(details["msg"]).lower()


_SIMPLE: Final[Mapping[str, str]] = {
    "string_too_short": "must not be empty",
    "finite_number": "must be a finite number",
}
_GOT: Final[Mapping[str, str]] = {
    "string_type": "must be a string",
    "bool_type": "must be a boolean (true or false)",
    "int_type": "must be an integer",
    "float_type": "must be a number",
}


def _bounds(root: type[BaseModel], loc: tuple[str | int, ...]) -> tuple[Any, Any]:
    """The ``ge`` and ``le`` of the key at ``loc`` (an integer between two bounds
    is said as "between")."""
    section = _section_at(root, tuple(p for p in loc[:-1] if isinstance(p, str)))
    field = section.model_fields[str(loc[-1])]
    found: dict[str, Any] = {}
    for item in _metadata(field.metadata, field.annotation):
        for name in ("ge", "le"):
            if hasattr(item, name):
                found[name] = getattr(item, name)
    return found.get("ge"), found.get("le")


def _metadata(metadata: list[Any], annotation: object) -> list[Any]:
    """Constraints on a field, also where they sit inside ``Annotated[...] | None``."""
    items = list(metadata)
    for arg in get_args(annotation):
        if get_origin(arg) is Annotated:
            for inner in get_args(arg)[1:]:
                items.extend(getattr(inner, "metadata", [inner]))
    return items


def _path(loc: tuple[str | int, ...]) -> str:
    path = ""
    for part in loc:
        path = f"{path}[{part}]" if isinstance(part, int) else _joined(path, part)
    return path


def _joined(path: str, rest: str) -> str:
    if not rest:
        return path or "config"  # the top level has no key of its own: the file's
    if rest.startswith("["):
        return f"{path}{rest}"
    rest = rest.removeprefix(".")
    return f"{path}.{rest}" if path else rest


def _section_at(root: type[BaseModel], loc: tuple[str | int, ...]) -> type[BaseModel]:
    shape = root
    for part in loc:
        if isinstance(part, str):
            found = section_in(shape.model_fields[part].annotation)
            assert found is not None, f"{part} of {shape.__name__} is not a section"
            shape = found
    return shape


def section_in(annotation: object) -> type[BaseModel] | None:
    """The model in ``DeclareSettings | None`` or ``tuple[BindingSettings, ...]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType, tuple):
        for arg in get_args(annotation):
            found = section_in(arg)
            if found is not None:
                return found
    return None
