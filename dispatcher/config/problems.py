"""pydantic's errors in our words: every problem of a file, each naming its key.

pydantic reports a location (``("bindings", 0, "delivery", "retry")``) and an
error type; users read ``bindings[0].delivery.retry: must be >= 0``. Our own
parsers' problems (``validation``) come with their words and the part of the
key they add (``[2]``, ``.Authorization``); pydantic's own are a missing key
(``required``) and an unknown one (the section's keys listed). A key whose
value came from an environment variable is named by the variable: the user has
to fix that, not the file. Input values are never echoed: the parsers show
them redacted where they may hold a secret, and pydantic's messages are not
used.
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping
from typing import Any, Final, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

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
    for details in error.errors(include_url=False, include_input=False):
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
    # Not reached by a file: every key has a parser of ours. Say it without the input.
    return _path(loc) or "config", str(details["msg"]).lower()


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
