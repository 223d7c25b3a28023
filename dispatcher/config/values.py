"""Scalar parsers: ``(value, key) -> typed value``, or a ``ConfigError`` naming ``key``.

Each reads one value of our own kinds as YAML (or an environment variable)
gave it: words in any case, sizes, names, files, the listen address, extra
headers, ``retry_on`` and event filters. Durations are in ``durations``, URLs
in ``urls``. A key's ``Accepts`` marker (``settings``) names its parser; plain
booleans, numbers and words are pydantic's strict types.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Final, TypeVar, get_args

from dispatcher import cesql
from dispatcher.config.filter_tree import (
    CesqlFilter,
    FilterEntry,
    MatchDialect,
    MatchFilter,
    NestingDialect,
    NestingFilter,
)
from dispatcher.config.redaction import show
from dispatcher.delivery.retry import RETRY_CLASSES
from dispatcher.errors import ConfigError


def string(value: object, key: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(key, f"must be a string, got {show(value)}")
    return value


def non_empty_string(value: object, key: str) -> str:
    text = string(value, key)
    if not text:
        raise ConfigError(key, "must not be empty")
    return text


Word = TypeVar("Word", bound=str)


def choice(
    options: tuple[Word, ...], *, aliases: Mapping[str, Word] | None = None
) -> Callable[[object, str], Word]:
    """One of ``options`` (a ``Literal``'s words) in any case; an alias stands for
    the option it maps to."""

    def parse(value: object, key: str) -> Word:
        if isinstance(value, str):
            text = value.lower()
            text = aliases.get(text, text) if aliases else text
            for option in options:
                if text == option:
                    return option
        raise ConfigError(key, f"must be one of {', '.join(options)}, got {show(value)}")

    return parse


def retry_on(value: object, key: str) -> tuple[int | str, ...]:
    """``delivery.retry_on``: statuses 100-599 (not 2xx, which is success) and the
    classes ``4xx``/``5xx``; a status may be written as a number or a string."""
    if not isinstance(value, list):
        raise ConfigError(
            key, f"must be a list of statuses and classes (e.g. [409, 5xx]), got {show(value)}"
        )
    entries: list[int | str] = []
    for index, item in enumerate(value):
        entry = _retry_entry(item, f"{key}[{index}]")
        if entry not in entries:
            entries.append(entry)
    return tuple(entries)


def _retry_entry(item: object, key: str) -> int | str:
    if isinstance(item, str) and item.lower() in RETRY_CLASSES:
        return item.lower()
    if isinstance(item, str) and re.fullmatch(r"[0-9]{3}", item):
        item = int(item)
    if isinstance(item, bool) or not isinstance(item, int):
        raise ConfigError(
            key, f"must be a status (409) or one of {', '.join(RETRY_CLASSES)}, got {show(item)}"
        )
    if not 100 <= item <= 599:
        raise ConfigError(key, f"must be an HTTP status between 100 and 599, got {item}")
    if 200 <= item <= 299:
        raise ConfigError(key, f"{item} is a success: it is never retried")
    return item


# RFC 9110 token characters; values: visible ASCII, spaces and tabs (no CR/LF).
HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
HEADER_VALUE: Final = re.compile(r"[\t -~]*")
# Written by the event mapping, by libcurl, or framing the request: never the user's.
_RESERVED_HEADERS: Final = frozenset(
    {"host", "connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "expect"}
)


def headers(value: object, key: str) -> tuple[tuple[str, str], ...]:
    """``headers``: extra request headers, a mapping of name to value."""
    if not isinstance(value, Mapping):
        raise ConfigError(key, f"must be a mapping of header names to values, got {show(value)}")
    seen: set[str] = set()
    pairs: list[tuple[str, str]] = []
    for name, raw in value.items():
        if not isinstance(name, str) or not HEADER_NAME.fullmatch(name):
            raise ConfigError(key, f"{show(name)} is not a header name (RFC 9110 token)")
        lower = name.lower()
        if lower.startswith(("ce-", "content-")) or lower in _RESERVED_HEADERS:
            raise ConfigError(
                f"{key}.{name}",
                "is written by dispatcher (the CloudEvent, its body or HTTP framing)",
            )
        if lower in seen:
            raise ConfigError(f"{key}.{name}", "is listed twice (header names ignore case)")
        seen.add(lower)
        if isinstance(raw, bool) or not isinstance(raw, str | int):
            raise ConfigError(f"{key}.{name}", f"must be a string, got {show(raw)}")
        text = str(raw)
        if not HEADER_VALUE.fullmatch(text):
            raise ConfigError(
                f"{key}.{name}", "must be printable ASCII: no line breaks or control characters"
            )
        pairs.append((name, text))
    return tuple(pairs)


# Knative's rule for attribute names in Trigger filters.
ATTRIBUTE_NAME: Final = re.compile(r"[a-z][a-z0-9]*")
_MATCH_DIALECTS: Final[tuple[str, ...]] = get_args(MatchDialect)
_NESTING_DIALECTS: Final[tuple[str, ...]] = get_args(NestingDialect)


def filter_attributes(
    value: object, key: str, *, allow_empty: bool = True
) -> tuple[tuple[str, str], ...]:
    """A mapping of CloudEvents attribute names (extensions included) to strings."""
    if not isinstance(value, Mapping):
        raise ConfigError(key, f"must be a mapping of attribute names to values, got {show(value)}")
    pairs: list[tuple[str, str]] = []
    for name, text in value.items():
        if not isinstance(name, str) or not ATTRIBUTE_NAME.fullmatch(name):
            raise ConfigError(
                key,
                f"{show(name)} is not an attribute name "
                "(a lower-case letter, then lower-case letters and digits)",
            )
        if not isinstance(text, str):
            raise ConfigError(f"{key}.{name}", f"must be a string (quote it), got {show(text)}")
        if not text and not allow_empty:
            raise ConfigError(
                f"{key}.{name}",
                "must not be empty (Knative skips such a filter; to require that an attribute "
                'exists, use filter.attributes with the value "")',
            )
        pairs.append((name, text))
    return tuple(pairs)


# all/any/not nested deeper than this is refused: no real filter needs it, and
# hundreds of levels would exhaust the stack of whatever walks the tree
# (``check``'s YAML output first).
MAX_FILTER_DEPTH: Final = 32


def filters(value: object, key: str) -> tuple[FilterEntry, ...]:
    """``filters``: Knative's newer Trigger filters, a list that must all pass."""
    return _filter_list(value, key, 1)


def _filter_list(value: object, key: str, depth: int) -> tuple[FilterEntry, ...]:
    if not isinstance(value, list):
        raise ConfigError(key, f"must be a list of filters, got {show(value)}")
    return tuple(_filter_entry(item, f"{key}[{index}]", depth) for index, item in enumerate(value))


def _filter_entry(value: object, key: str, depth: int) -> FilterEntry:
    if depth > MAX_FILTER_DEPTH:
        raise ConfigError(key, f"filters nest at most {MAX_FILTER_DEPTH} levels deep")
    entry = mapping(value, key)
    dialects = [*_MATCH_DIALECTS, *_NESTING_DIALECTS, "cesql"]
    unknown = [name for name in entry if name not in dialects]
    if unknown:
        raise ConfigError(
            f"{key}.{written(unknown[0])}",
            f"unknown filter dialect (expected one of: {', '.join(dialects)})",
        )
    if len(entry) != 1:
        found = " and ".join(entry) if entry else "none"
        raise ConfigError(key, f"a filter has exactly one dialect, found {found}")
    [(dialect, body)] = entry.items()
    where = f"{key}.{dialect}"
    if dialect == "cesql":
        return cesql_filter(body, where)
    if dialect in _MATCH_DIALECTS:
        attributes = filter_attributes(body, where, allow_empty=False)
        if not attributes:
            raise ConfigError(where, "must name at least one attribute")
        return MatchFilter(dialect, attributes)  # type: ignore[arg-type]
    if dialect == "not":
        return NestingFilter("not", (_filter_entry(body, where, depth + 1),))
    nested = _filter_list(body, where, depth + 1)
    if not nested:
        raise ConfigError(where, "must list at least one filter")
    return NestingFilter(dialect, nested)  # type: ignore[arg-type]


def cesql_filter(value: object, key: str) -> CesqlFilter:
    """A CloudEvents SQL expression, compiled here so that ``check`` shows where it
    is wrong; the filter compiles it again when the service starts."""
    text = string(value, key)
    if not text.strip():
        raise ConfigError(key, "must be a CESQL expression, got an empty string")
    try:
        cesql.parse(text)
    except cesql.CesqlError as error:
        raise ConfigError(key, f"{error} in {text!r}") from None
    return CesqlFilter(text)


BINDING_NAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def binding_name(value: object, key: str) -> str:
    name = string(value, key)
    # Names become Prometheus label values and log fields: keep them plain.
    if not BINDING_NAME.fullmatch(name):
        raise ConfigError(key, f"must be 1-64 characters of A-Z a-z 0-9 _ . - (got {show(name)})")
    return name


def queue_name(value: object, key: str) -> str:
    name = non_empty_string(value, key)
    if len(name.encode("utf-8")) > 255:  # AMQP 0-9-1 shortstr limit
        raise ConfigError(key, "must be at most 255 bytes")
    return name


def existing_file(value: object, key: str) -> str:
    path = non_empty_string(value, key)
    # Relative paths are relative to the working directory, as they will be
    # when the TLS context is built.
    if os.path.isdir(path):
        raise ConfigError(key, f"is a directory, not a file: {path}")
    if not os.path.isfile(path):
        raise ConfigError(key, f"file not found: {path}")
    return path


SIZE_UNITS: Final = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "kib": 1024, "mib": 1024**2}
_SIZE_RE: Final = re.compile(r"([0-9]+)\s*([A-Za-z]*)")


def size(value: object, key: str) -> int:
    if isinstance(value, str):
        match = _SIZE_RE.fullmatch(value.strip())
        if match is None or match.group(2).lower() not in SIZE_UNITS:
            raise ConfigError(
                key, f"invalid size {show(value)} (use bytes or a B, KB, MB, KiB or MiB suffix)"
            )
        count = int(match.group(1)) * SIZE_UNITS[match.group(2).lower()]
    elif isinstance(value, int) and not isinstance(value, bool):
        count = value
    else:
        raise ConfigError(key, f"must be a size such as 8MiB or 8388608, got {show(value)}")
    if count <= 0:
        raise ConfigError(key, "must be > 0")
    return count


def split_listen(listen: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); empty host = all IPv4 interfaces; IPv6 in brackets.

    Raises ``ValueError`` saying what is wrong (``listen`` makes it a
    ``ConfigError`` naming the key).
    """
    if "://" in listen:
        raise ValueError("must be host:port, not a URL (e.g. 0.0.0.0:9090)")
    if listen != listen.strip() or " " in listen:
        raise ValueError("must be host:port, without spaces")
    if listen.startswith("["):
        host, bracket, rest = listen[1:].partition("]")
        if not bracket or not host or not rest.startswith(":"):
            raise ValueError("must be host:port, IPv6 hosts in brackets ([::1]:9090)")
        port_text = rest[1:]
    else:
        host, colon, port_text = listen.rpartition(":")
        if not colon:
            raise ValueError("must be host:port (e.g. 0.0.0.0:9090)")
        if ":" in host:
            raise ValueError("IPv6 hosts must be in brackets ([::]:9090)")
        host = host or "0.0.0.0"
    # Port 0 asks the OS for a free port (tests, several instances on one host).
    if not (port_text.isascii() and port_text.isdigit()) or not 0 <= int(port_text) <= 65535:
        raise ValueError("port must be 0..65535")
    return host, int(port_text)


def listen(value: object, key: str) -> str:
    address = string(value, key)
    try:
        split_listen(address)
    except ValueError as err:
        raise ConfigError(key, f"{err}, got {show(address)}") from None
    return address


def mapping(raw: object, key: str) -> Mapping[str, object]:
    # The top level has no key of its own: its errors name the file ("config").
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(key or "config", f"must be a mapping, got {show(raw)}")
    for name in raw:
        if not isinstance(name, str):
            raise ConfigError(key or "config", f"keys must be strings, got {show(name)}")
    return raw


_PLAIN_KEY: Final = re.compile(r"[^\s.\[\]'\"]+")


def written(name: str) -> str:
    """An unknown key as the message names it: as written when plain, quoted when
    it is empty or could read as a path (``a.b``, ``x[0]``) or hide in spaces."""
    return name if _PLAIN_KEY.fullmatch(name) and name.isprintable() else repr(name)
