"""Bad configuration never crashes: the loader returns Settings or a ConfigError naming a key.

What `dispatcher check` and `dispatcher run` do with a file and the environment
(``load_settings``, then ``render_effective_config``) is fed generated input:
random YAML documents (tags, anchors, merges, duplicate keys, non-mapping
roots, several documents, invalid UTF-8 and UTF-16), the example file with
random edits, config-shaped trees with a random value for every key (wrong
types, nesting, huge and negative numbers, NaN and infinities, unicode, bytes,
dates) and random environment variables, Knative drop-in mode's included.
Anything but Settings or a ConfigError whose message starts with a real key
path or variable is a failure.

The example count is fixed (``FUZZ_EXAMPLES``, default 100 per test) and
``derandomize=True`` with no example database: every run, on every machine,
tries the same inputs, so CI cannot fail by luck and a failure reproduces by
running the test again. A long campaign is the same tests with a larger count:

    FUZZ_EXAMPLES=50000 .venv/bin/python -m pytest -q -p no:cacheprovider \
        tests/unit/test_fuzz_config.py

Regressions found by such campaigns are pinned with ``@example`` (or in
``REGRESSIONS``) so they run every time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, get_origin

import pytest
import yaml
from hypothesis import HealthCheck, example, given
from hypothesis import strategies as st
from pydantic import BaseModel

from dispatcher import config as config_module
from dispatcher.config import Settings, knative, load_settings, render_effective_config
from dispatcher.config.problems import section_in
from dispatcher.errors import ConfigError
from tests.support.fuzz import fuzz_settings

FUZZ = fuzz_settings(100, suppress=list(HealthCheck))
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_FILE = (ROOT / "config" / "dispatcher.example.yaml").read_text(encoding="utf-8")
SUBSCRIBER = "http://127.0.0.1:8080/"

# The variables the loader reads, and Knative drop-in mode's, from its own table
# (SUBSCRIBER_CACERTS is left out: each value would leave a CA file in the temp
# folder, and what it holds is not checked at load).
OVERRIDES = ("RABBITMQ_URL", "DISPATCHER_LISTEN", "LOG_LEVEL", "LOG_FORMAT")
KNATIVE = tuple(sorted({*knative.ORIGINS.values(), "RABBITMQ_VHOST"} - {"SUBSCRIBER_CACERTS"}))
VARIABLES = frozenset({*OVERRIDES, *KNATIVE, "DISPATCHER_CONFIG", "config"})


# --------------------------------------------------------------------------
# The key paths a message may name, from the settings models themselves
# --------------------------------------------------------------------------


def _key_paths(shape: type[BaseModel], prefix: str) -> set[str]:
    paths: set[str] = set()
    for name, f in shape.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        paths.add(path)
        nested = section_in(f.annotation)
        if nested is not None:
            sub = f"{path}[]" if get_origin(f.annotation) is tuple else path
            paths.add(sub)
            paths |= _key_paths(nested, sub)
    return paths


KEY_PATHS = frozenset(_key_paths(Settings, ""))


def _open_paths(shape: type[BaseModel], prefix: str) -> set[str]:
    """Keys that hold lists or mappings of values (``broker.url``, ``retry_on``,
    ``headers``, ``filters``...): an error may name a place inside them."""
    paths: set[str] = set()
    for name, f in shape.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        nested = section_in(f.annotation)
        if nested is not None:
            sub = f"{path}[]" if get_origin(f.annotation) is tuple else path
            paths |= _open_paths(nested, sub)
        elif "tuple[" in str(f.annotation):
            paths.add(path)
    return paths


OPEN_PATHS = frozenset(_open_paths(Settings, ""))
UNKNOWN_KEY = "unknown key (expected one of: "


def names_a_key(key: str, problem: str) -> bool:
    """A variable, a real key path (``bindings[2].delivery.retry``), or, for an
    unknown key, the key as the user wrote it (any text: it is theirs)."""
    if key in VARIABLES or problem.startswith(UNKNOWN_KEY):
        return bool(key)
    path = re.sub(r"\[[0-9]+\]", "[]", key)
    return path in KEY_PATHS or any(
        path.startswith((f"{open_path}[", f"{open_path}.")) for open_path in OPEN_PATHS
    )


def assert_settles(load: Callable[[], Settings]) -> None:
    """Settings (and `check`'s rendering of them), or a ConfigError naming a key."""
    try:
        result = load()
    except ConfigError as err:
        assert err.key, f"a ConfigError names no key: {err}"
        assert str(err).startswith(f"{err.key}: "), str(err)
        assert names_a_key(err.key, err.problem), f"{err.key!r} is no key or variable: {err}"
        return
    assert isinstance(result, Settings)
    render_effective_config(result)


# --------------------------------------------------------------------------
# Values: anything YAML or a caller can produce
# --------------------------------------------------------------------------

# YAML cannot carry surrogates; everything else printable or not may appear.
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([0, -1, 1, 65535, 65536, 2**63, 10**400, -(10**400)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324]),
)
# Strings close to what a key accepts, so the fuzzer gets past the type checks.
NEAR_MISSES = st.sampled_from(
    [
        "",
        " ",
        "0",
        "-1",
        "1e999",
        "nan",
        "inf",
        "0s",
        "-0s",
        "1.5s",
        "1m30s",
        "9" * 400 + "h",
        "PT0.25S",
        "P1Y",
        "P",
        "PT",
        "P1DT",
        "1,5s",
        "500µs",
        "8MiB",
        "99999999999999999999999TiB",
        "0MiB",
        "amqp://guest:guest@localhost:5672/%2F",
        "amqp://h:0/",
        "amqp://h:99999/",
        "amqp://[::1/",
        "amqp://h/?heartbeat=abc",
        "amqp://h/?channel_max=-1",
        "amqp://h/?ssl_options=%7B",
        "amqp://h/?connection_attempts=1e999",
        "amqps://h/?ssl_options=x",
        "http://[",
        "http://[::1]:/",
        "http://h:99999999999999999999/",
        "http://h/%zz",
        "http://2130706433/",
        "http://a..b/",
        "http://xn--/",
        "https://" + "a" * 300 + "/",
        "0.0.0.0:9090",
        "[::]:9090",
        "[:9090",
        ":99999",
        "h:" + "9" * 5000,
        "debug",
        "WARN",
        "quorum",
        "classic",
        "json",
        "/dev/null",
        "/",
        "\x00",
        "\ud7ff",
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    NUMBERS,
    TEXT,
    NEAR_MISSES,
    st.binary(max_size=20),
    st.dates(),
    st.datetimes(),
)
ANY = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.one_of(TEXT, st.integers(), st.none(), st.booleans()), inner, max_size=4
        ),
    ),
    max_leaves=12,
)


def _valid_values() -> dict[str, Any]:
    """One value each key accepts, so generated trees get deep before one breaks."""
    return {
        "url": "amqp://guest:guest@localhost:5672/%2F",
        "heartbeat": "20s",
        "connection_name": "c",
        "blocked_timeout": "60s",
        "initial_delay": "200ms",
        "max_delay": "30s",
        "listen": "127.0.0.1:0",
        "grace": "25s",
        "level": "info",
        "format": "json",
        "name": "orders",
        "queue": "orders",
        "subscriber": SUBSCRIBER,
        "durable": True,
        "type": "quorum",
        "dead_letter_exchange": "dlx",
        "delivery_limit": 3,
        "content_mode": "binary",
        "parallelism": 10,
        "ordered": False,
        "retry": 5,
        "backoff_policy": "linear",
        "backoff_delay": "1s",
        "backoff_max": "10s",
        "timeout": "10s",
        "dedupe_window": "10m",
        "sink": "http://sink/",
        "exchange": "x",
        "routing_key": "r",
        "non_cloudevent": "wrap",
        "max_body_size": "1MiB",
        "ca_file": None,
        "cert_file": None,
        "key_file": None,
        "retry_on": [409, "5xx"],
        "headers": {"X-Tenant": "blue"},
        "bearer_token_file": None,
        "attributes": {"type": "com.example.a", "source": ""},
        "filters": [
            {"exact": {"type": "com.example.a"}},
            {"any": [{"prefix": {"source": "/x"}}, {"not": {"suffix": {"id": "1"}}}]},
        ],
    }


VALID = _valid_values()
# Where one value per key name is not enough: the reply's url is an HTTP one.
VALID_IN: dict[tuple[type, str], Any] = {(config_module.ReplySettings, "url"): "http://reply/"}
# Keys a valid tree needs although the loader has a default or a rule elsewhere
# asks for them: at least one binding; delivery_limit only with type: quorum.
_NEEDED_FOR_VALID = {(Settings, "bindings"), (config_module.DeclareSettings, "type")}


def _section(shape: type[BaseModel], draw: st.DrawFn, junk: bool = True) -> dict[Any, Any]:
    """A mapping with ``shape``'s keys, each left out, valid, or random junk (none
    with ``junk=False``, and required keys always there: a valid config, but for
    rules between keys)."""
    out: dict[Any, Any] = {}
    for name, f in shape.model_fields.items():
        required = f.is_required() or (shape, name) in _NEEDED_FOR_VALID
        if junk:
            choice = draw(st.sampled_from(["omit", "valid", "valid", "junk", "nested"]))
        else:
            choice = draw(st.sampled_from(["valid", "nested"] + ([] if required else ["omit"])))
        nested = section_in(f.annotation)
        if choice == "omit":
            continue
        if nested is not None and choice in ("valid", "nested"):
            one = _section(nested, draw, junk)
            is_list = get_origin(f.annotation) is tuple
            out[name] = (
                [one] + [_section(nested, draw, junk) for _ in range(draw(st.integers(0, 2)))]
                if is_list
                else one
            )
        elif name in VALID and (choice == "valid" or not junk):
            out[name] = VALID_IN.get((shape, name), VALID[name])
        elif junk:
            out[name] = draw(ANY)
    if junk and draw(st.integers(0, 9)) == 0:
        out[draw(st.one_of(TEXT, st.integers(), st.none()))] = draw(ANY)
    return out


@st.composite
def config_trees(draw: st.DrawFn, junk: bool = True) -> dict[Any, Any]:
    return _section(Settings, draw, junk)


# --------------------------------------------------------------------------
# YAML text and bytes
# --------------------------------------------------------------------------

YAML_PIECES = [
    "!!python/object/apply:os.system ['true']",
    "!!python/name:os.system",
    "!!binary aGVsbG8=",
    "!!binary '***'",
    "!!set {a, b}",
    "!!omap [a: 1, b: 2]",
    "!!pairs [a: 1, a: 2]",
    "!!timestamp 2001-12-14",
    "!!timestamp nope",
    "!!float .nan",
    "!!float -.inf",
    "!!int 0x_",
    "!!int 99999999999999999999999999",
    "!!str",
    "!!null x",
    "!!bool maybe",
    "!custom {a: 1}",
    "!<tag:yaml.org,2002:map> [1]",
    "&a {x: 1}",
    "*a",
    "*undefined",
    "{<<: [*a, *a]}",
    "{<<: 1}",
    "{<<: [1]}",
    "[&b [*b]]",
    "{? [1, 2] : x}",
    "{? {a: 1} : x}",
    "{a: 1, a: 2}",
    "{1: a, 1.0: b}",
    "{null: 1, ~: 2}",
    "{.nan: 1}",
    "2001-12-14t21:59:43.10-05:00",
    "0o777",
    "1_000",
    "0b101",
    "190:20:30",
    "'unterminated",
    '"\\uD800"',
    '"\\x00"',
    "|\n  block",
    "@reserved",
    "`backtick",
    "%TAG ! tag:x,2000:",
    "---",
    "...",
    "- - - -",
    "[" * 50,
    "{",
    "\t",
]


@st.composite
def yaml_documents(draw: st.DrawFn) -> bytes:
    """YAML text built from a config tree, hostile pieces spliced into it."""
    tree = draw(config_trees())
    try:
        text = yaml.safe_dump(tree, allow_unicode=draw(st.booleans()), sort_keys=False)
    except (yaml.YAMLError, ValueError, TypeError):
        text = MINIMAL
    lines = text.splitlines()
    for _ in range(draw(st.integers(0, 4))):
        piece = draw(st.sampled_from(YAML_PIECES))
        at = draw(st.integers(0, len(lines)))
        if at < len(lines) and draw(st.booleans()):
            line = lines[at]
            cut = line.find(": ")
            lines[at] = (line[: cut + 2] if cut >= 0 else line + " ") + piece
        else:
            lines.insert(at, draw(st.sampled_from(["", "  ", "    "])) + piece)
    encoded = "\n".join(lines) + draw(st.sampled_from(["", "\n", "\n---\n{}\n", "\n...\n"]))
    encoding = draw(st.sampled_from(["utf-8", "utf-8", "utf-8-sig", "utf-16", "utf-16-le"]))
    return encoded.encode(encoding, errors="surrogatepass")


@st.composite
def edited_example(draw: st.DrawFn) -> bytes:
    """The annotated example file with random byte edits: near-valid documents."""
    data = bytearray(EXAMPLE_FILE.encode("utf-8"))
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(data)))
        what = draw(st.sampled_from(["insert", "delete", "replace"]))
        chunk = draw(
            st.one_of(
                st.binary(min_size=1, max_size=4),
                st.sampled_from(
                    [b":", b"- ", b"\n  ", b"&a ", b"*a", b"!!", b"{", b"'", b"\xff", b"\t"]
                ),
            )
        )
        if what == "insert":
            data[at:at] = chunk
        elif what == "delete":
            del data[at : at + len(chunk)]
        else:
            data[at : at + len(chunk)] = chunk
    return bytes(data)


ROOTS = st.sampled_from(
    [
        b"",
        b"\n",
        b"~",
        b"null",
        b"[]",
        b"- 1",
        b"42",
        b".nan",
        b"'text'",
        b"!!binary aGk=",
        b"\xef\xbb\xbf",
        b"\xff\xfe",
        b"\x00",
        b"--- {}\n--- {}\n",
        b"&a [*a]",
        b"bindings: &b [*b]",
        b"\xef\xbb\xbfbindings: []",
    ]
)
FILE_BYTES = st.one_of(yaml_documents(), edited_example(), ROOTS, st.binary(max_size=200))

MINIMAL = f"bindings:\n  - name: orders\n    queue: orders\n    subscriber: {SUBSCRIBER}\n"


# --------------------------------------------------------------------------
# Environment variables
# --------------------------------------------------------------------------

# A real environment holds no NUL; everything else may be there.
ENV_TEXT = st.one_of(
    st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=30),
    NEAR_MISSES.filter(lambda s: "\x00" not in s),
    st.integers().map(str),
    st.sampled_from(["1", "0", "-5", "10", "exponential", "linear", "1e400", " 7 ", "١٢"]),
)


def environments(names: tuple[str, ...]) -> st.SearchStrategy[dict[str, str]]:
    return st.dictionaries(st.sampled_from(names), ENV_TEXT, max_size=len(names))


# --------------------------------------------------------------------------
# The properties
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def load_file(folder: Path, data: bytes, environ: Mapping[str, str]) -> Settings:
    path = folder / "dispatcher.yaml"
    path.write_bytes(data)
    return load_settings(str(path), environ)


@given(data=FILE_BYTES, environ=environments(OVERRIDES))
@example(data=b"1: x\n", environ={})
# PyYAML raises KeyError, ValueError or RecursionError, not YAMLError, for these
# (found by FUZZ_EXAMPLES=10000).
@example(data=b"http: !!bool maybe\n", environ={})
@example(data=b"http: {listen: !!int x}\n", environ={})
@example(data=b"shutdown: {grace: !!timestamp 2026-13-01}\n", environ={})
@example(data=b"bindings: " + b"[" * 5000, environ={})
@example(data=b"bindings: " + b"[" * 5000 + b"]" * 5000, environ={})
@FUZZ
def test_any_file_and_environment(workdir: Path, data: bytes, environ: dict[str, str]) -> None:
    assert_settles(lambda: load_file(workdir, data, environ))


@given(tree=config_trees(), environ=environments(OVERRIDES))
@example(tree={"": None}, environ={})
@FUZZ
def test_any_value_for_every_key(
    workdir: Path, tree: dict[Any, Any], environ: dict[str, str]
) -> None:
    # The same tree through the file (YAML's reading of it) and through
    # settings_from_dict (the Knative path's), which also sees what YAML can't write.
    assert_settles(lambda: config_module.settings_from_dict(tree, environ))
    try:
        data = yaml.safe_dump(tree, allow_unicode=True).encode("utf-8")
    except (yaml.YAMLError, ValueError, TypeError):
        return
    assert_settles(lambda: load_file(workdir, data, environ))


@given(environ=environments(KNATIVE + OVERRIDES))
@FUZZ
def test_any_knative_environment(workdir: Path, environ: dict[str, str]) -> None:
    # No config file and QUEUE_NAME set: the binding comes from the variables.
    environ = {**environ, "DISPATCHER_CONFIG": str(workdir / "absent.yaml")}
    if "QUEUE_NAME" not in environ:
        environ["QUEUE_NAME"] = "orders"
    assert_settles(lambda: load_settings(None, environ))


def test_names_a_key_can_fail() -> None:
    # The oracle itself: a key path the settings do not have is refused.
    assert names_a_key("bindings[0].delivery.retry", "must be >= 0")
    assert names_a_key("broker.typo", UNKNOWN_KEY + "...)")
    assert not names_a_key("", "keys must be strings, got 1")
    assert not names_a_key("nonsense", "must be a mapping")
    assert not names_a_key("bindings.retry", "must be >= 0")


# Crashes and key-less errors the campaigns found, as the user now sees them.
REGRESSIONS: list[tuple[dict[Any, Any], str]] = [
    # The top level's errors had no key at all: "keys must be strings, got 1".
    ({1: "x"}, "config: keys must be strings, got 1"),
    # An empty key named nothing ("unknown key (...)"); a dotted one read as a path.
    ({"": None}, "'': unknown key (expected one of: "),
    ({"a.b": 1}, "'a.b': unknown key (expected one of: "),
    ({"broker": {" ": 1}}, "broker.' ': unknown key (expected one of: "),
]


@pytest.mark.parametrize(("tree", "message"), REGRESSIONS, ids=[repr(r[0]) for r in REGRESSIONS])
def test_regressions(tree: dict[Any, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_module.settings_from_dict(tree, {})
    assert str(info.value).startswith(message)
