"""Passwords in URLs: hidden whatever a user typed, wherever a URL is shown.

Users paste passwords without percent-encoding them, so a password may hold
``/``, ``?``, ``#``, ``@``, ``%``, spaces or anything else printable. The
properties are checked on generated URLs (hypothesis), with a fixed example
count and ``derandomize=True``: the same inputs on every run, so CI cannot
flake and a failure reproduces by running the test again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dispatcher.config import (
    effective_config,
    load_settings,
    redact_url,
    render_effective_config,
    settings_from_dict,
)
from dispatcher.errors import ConfigError
from tests.support.fuzz import fuzz_settings

PROPERTY = fuzz_settings(200)

# Printable text, delimiters included: what a person types into a password
# field (letters of any script, digits, punctuation, spaces), no control codes.
PRINTABLE = st.characters(categories=["L", "N", "P", "S", "Zs"])
# A password always carries this marker, so "the password is not in the output"
# cannot be fooled by a trivial password ("a", "/") that also occurs in the host
# or path; the rest of it is anything printable, "://" and "@" included.
MARKER = "Pw9zQ"
PASSWORDS = st.builds(
    lambda before, after: before + MARKER + after,
    st.text(PRINTABLE, max_size=12),
    st.text(PRINTABLE, max_size=12),
)
# A user name cannot hold ":" (the first ":" of the userinfo starts the
# password); anything else printable may be there, "@" and "/" included.
USERS = st.text(st.characters(categories=["L", "N", "P", "S", "Zs"], exclude_characters=":"))
SCHEMES = st.sampled_from(["amqp", "amqps", "http", "https", "redis", "rediss", "HTTP"])
HOSTS = st.one_of(
    st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z][a-z0-9-]{0,10}){0,3}", fullmatch=True),
    st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){3}", fullmatch=True),
    st.just("[::1]"),
)
PORTS = st.one_of(st.just(""), st.integers(0, 65535).map(lambda p: f":{p}"))
# Paths and queries as RFC 3986 writes them, "@" and ":" included.
TAIL_CHARS = st.characters(categories=[], include_characters="abcXYZ019-._~!$&'()*+,;=:@/%")
PATHS = st.one_of(st.just(""), st.text(TAIL_CHARS, max_size=15).map(lambda p: "/" + p))
QUERIES = st.one_of(st.just(""), st.text(TAIL_CHARS, max_size=15).map(lambda q: "?" + q))


@st.composite
def urls_with_password(draw: st.DrawFn) -> tuple[str, str]:
    password = draw(PASSWORDS)
    url = (
        f"{draw(SCHEMES)}://{draw(USERS)}:{password}@{draw(HOSTS)}{draw(PORTS)}"
        f"{draw(PATHS)}{draw(QUERIES)}"
    )
    return url, password


@given(urls_with_password())
@example(("amqp://user:pa/ss" + MARKER + "@host/", "pa/ss" + MARKER))
@example(("amqp://user:a?b#c@d%zz " + MARKER + "@host:5672/%2F", "a?b#c@d%zz " + MARKER))
@example(("rediss://:" + MARKER + "://x@cache:6380/0", MARKER + "://x"))
@PROPERTY
def test_redacted_url_never_shows_the_password(case: tuple[str, str]) -> None:
    url, password = case
    redacted = redact_url(url)
    assert MARKER not in redacted, (url, redacted)
    assert password not in redacted


@given(urls_with_password())
@PROPERTY
def test_redaction_keeps_the_scheme_and_user(case: tuple[str, str]) -> None:
    # Redaction hides the secret, nothing more: the reader still sees whose
    # credentials are in use and which kind of service is meant.
    url, _ = case
    scheme, _, rest = url.partition("://")
    user = rest.split(":", 1)[0]
    assert redact_url(url).startswith(f"{scheme}://{user}:***@")


@st.composite
def urls_without_password(draw: st.DrawFn) -> str:
    # A user name alone (no ":") is no secret. A path or query holding both a
    # ":" and a later "@" is left out: "http://h:1/a@b" might be user "h" with
    # password "1/a" (see redact_url), and hiding it is the safe reading.
    user = draw(st.one_of(st.just(""), USERS.filter(lambda u: "@" not in u).map(lambda u: u + "@")))
    tail = draw(PATHS) + draw(QUERIES)
    port = draw(PORTS)
    if "@" in tail and (":" in port + tail.split("@")[0]):
        tail = tail.replace("@", "%40")
    return f"{draw(SCHEMES)}://{user}{draw(HOSTS)}{port}{tail}"


@given(urls_without_password())
@example("http://host:8080/a")
@example("http://host/p?email=a@b")
@PROPERTY
def test_url_without_a_password_is_unchanged(url: str) -> None:
    assert redact_url(url) == url


# --------------------------------------------------------------------------
# Every place the configuration shows a URL
# --------------------------------------------------------------------------

SUBSCRIBER = "http://127.0.0.1:8080/"
URL_KEYS = ("broker.url", "subscriber", "dead_letter.sink", "reply.url")


def config_with(key: str, url: str) -> dict[str, Any]:
    binding: dict[str, Any] = {"name": "orders", "queue": "orders", "subscriber": SUBSCRIBER}
    raw: dict[str, Any] = {"bindings": [binding]}
    if key == "broker.url":
        raw["broker"] = {"url": url}
    elif key == "subscriber":
        binding["subscriber"] = url
    else:
        section, name = key.split(".")
        binding[section] = {name: url}
    return raw


def shown(raw: dict[str, Any], environ: dict[str, str]) -> str:
    """What a user sees: the error message, or `dispatcher check`'s output."""
    try:
        settings = settings_from_dict(raw, environ)
    except ConfigError as err:
        return str(err)
    return render_effective_config(settings) + repr(effective_config(settings))


@given(
    st.sampled_from(URL_KEYS),
    st.sampled_from(["amqp", "amqps", "http", "https", "ftp", "redis"]),
    PASSWORDS,
    HOSTS,
    PATHS,
)
@PROPERTY
def test_config_output_and_errors_never_show_the_password(
    key: str, scheme: str, password: str, host: str, path: str
) -> None:
    # Accepted (check's output) or refused (the error), never the password.
    url = f"{scheme}://svc:{password}@{host}{path}"
    assert MARKER not in shown(config_with(key, url), {})


@given(PASSWORDS, HOSTS)
@PROPERTY
def test_rabbitmq_url_errors_never_show_the_password(password: str, host: str) -> None:
    # The variable's forms a user gets wrong: no scheme, or no scheme name.
    raw = config_with("subscriber", SUBSCRIBER)
    for url in (
        f"amqp://svc:{password}@{host}/",
        f"svc:{password}@{host}",
        f"//svc:{password}@{host}",
    ):
        assert MARKER not in shown(raw, {"RABBITMQ_URL": url})


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("amqp://user:pa/ss@host/", "pa/ss"),
        ("amqp://user:12/ss@host/", "12/ss"),
        ("amqp://user:p?ss@host/", "p?ss"),
        ("amqp://user:p#ss@host/", "p#ss"),
        ("amqp://user:p ss@host/", "p ss"),
        ("http://user:p%zz@host/", "p%zz"),
        ("user:pa/ss@host", "pa/ss"),
    ],
)
@pytest.mark.parametrize("key", URL_KEYS)
def test_unencoded_passwords_never_shown(key: str, url: str, secret: str) -> None:
    assert secret not in shown(config_with(key, url), {})


@given(st.sampled_from(URL_KEYS), urls_with_password())
@PROPERTY
def test_an_accepted_url_is_shown_with_the_host_it_reaches(key: str, case: tuple[str, str]) -> None:
    # The redacted form must not hide or invent the host: with an unencoded "/"
    # in the password, "amqp://u:12/x@host/" reaches host "u" port 12 (RFC
    # 3986) but would show as "amqp://u:***@host/", so such a URL is refused.
    url, _ = case
    try:
        settings = settings_from_dict(config_with(key, url), {})
    except ConfigError:
        return
    host = urlsplit(url).hostname
    assert host is not None
    shown_host = f"[{host}]" if ":" in host else host
    assert f"@{shown_host}" in render_effective_config(settings).lower()


@pytest.mark.parametrize("key", URL_KEYS)
def test_an_at_after_the_host_is_refused(key: str) -> None:
    url = {"broker.url": "amqp", "subscriber": "http"}.get(key, "https") + "://u:12/ss@host/"
    with pytest.raises(ConfigError) as info:
        settings_from_dict(config_with(key, url), {})
    prefix = "broker.url" if key == "broker.url" else f"bindings[0].{key}"
    assert str(info.value).startswith(f"{prefix}: must be an ")
    assert "without an '@' after the host" in str(info.value)
    assert "12/ss" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("amqp://user:pa/ss@host/", "amqp://user:***@host/"),
        ("redis://:pa ss@cache:6379/0", "redis://:***@cache:6379/0"),
        ("rediss://me@corp:p@ss@cache/", "rediss://me@corp:***@cache/"),
        ("guest:secret@localhost", "guest:***@localhost"),
        ("//guest:secret@localhost/", "//guest:***@localhost/"),
        ("mailto:a@b", "mailto:a@b"),
        ("http://host/p?email=a@b", "http://host/p?email=a@b"),
        ("not a url", "not a url"),
        # redis-py reads a password from the query too
        ("redis://cache:6379/0?password=s3cret", "redis://cache:6379/0?password=***"),
        ("rediss://cache/0?db=1&PASSWORD=s3&x=1", "rediss://cache/0?db=1&PASSWORD=***&x=1"),
        ("https://h/f?sig=abc%2F&sv=2024#top", "https://h/f?sig=***&sv=2024#top"),
        (
            "https://h/f?X-Goog-Signature=abc&AWSAccessKeyId=k",
            "https://h/f?X-Goog-Signature=***&AWSAccessKeyId=***",
        ),
        ("http://host/p?passwordless=1", "http://host/p?passwordless=1"),
    ],
)
def test_redact_url_examples(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted


def test_yaml_errors_keep_their_at_signs(tmp_path: Path) -> None:
    # The YAML parser's own words are no secret: only URLs are masked in them.
    path = tmp_path / "dispatcher.yaml"
    path.write_text("bindings: @oops\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_settings(str(path), {})
    assert "found character '@'" in str(info.value)


def test_a_store_password_in_the_query_is_never_shown() -> None:
    """redis-py reads ``?password=`` as the store's password: `check` and the store's
    log lines quote the URL through ``redact_url``."""
    raw = config_with("subscriber", SUBSCRIBER)
    raw["dedupe"] = {"store": f"redis://cache:6379/0?password={MARKER}"}
    output = shown(raw, {})
    assert "password=***" in output
    assert MARKER not in output
