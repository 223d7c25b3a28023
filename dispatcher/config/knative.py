"""Knative drop-in mode: one binding from the Knative RabbitMQ dispatcher's variables.

With no config file and ``QUEUE_NAME`` set, the service reads the environment
the Knative eventing-rabbitmq controller gives its dispatcher, with Knative's
defaults and meanings:

=====================  ===========================  ===============================
variable               becomes                      Knative default / meaning
=====================  ===========================  ===============================
QUEUE_NAME             bindings[0].queue            required
RABBIT_URL             broker.url                   required (RABBITMQ_URL overrides)
SUBSCRIBER             bindings[0].subscriber       required
PARALLELISM            bindings[0].parallelism      1
RETRY                  delivery.retry               0; retries after the first attempt
BACKOFF_POLICY         delivery.backoff_policy      exponential (empty) or linear
BACKOFF_DELAY          delivery.backoff_delay       50ms, a Go duration; 0 means 50ms
(none)                 delivery.backoff_max         Knative has no cap: the longest
                                                    wait of the retry schedule
TIMEOUT                delivery.timeout             0 = none in Knative; here 0 or
                                                    unset keeps the 10s default,
                                                    since every attempt needs a bound
DLX_NAME               dead_letter.exchange         the trigger's dead-letter exchange
DEAD_LETTER_SINK       dead_letter.sink             (ours; Knative resolves it elsewhere)
BROKER_INGRESS_URL     reply.url                    replies go back into the broker
RABBITMQ_VHOST         broker.url's virtual host    replaces the URL's vhost when set
                                                    (every node's, for a cluster)
SUBSCRIBER_CACERTS     bindings[0].tls.ca_file      PEM text (kept in a private file)
K_OBSERVABILITY_CONFIG tracing                      JSON; its ``tracing`` with protocol
                                                    http/protobuf: the endpoint (a whole
                                                    URL, /v1/traces included) and
                                                    samplingRate; grpc, stdout: not
                                                    spoken here, tracing stays off
                                                    (``advice`` says so)
DLX                    (no effect)                  Knative acks failures on its DLQ
                                                    dispatcher, dropping them; without
                                                    a dead-letter target we reject
                                                    them, so only the queue's own
                                                    dead-letter exchange keeps them
=====================  ===========================  ===============================

Filters and subscriber auth have no variables to map: Knative's controller
applies a Trigger's ``filter.attributes`` as the queue's binding arguments
(``x-match: all`` on the message headers), ignores ``filters``, and supports
no OIDC for this broker class. Its other variables (``K_LOGGING_CONFIG``,
``K_TRACING_CONFIG`` (Zipkin, before Knative 1.19), ``K_KLOG_VERBOSITY``, ``SYSTEM_NAMESPACE``,
``NAMESPACE``, ``CONTAINER_NAME``, ``POD_NAME``, ``REQUEUE``) are ignored.

``RABBITMQ_URL`` (ours) may name a cluster's nodes, comma-separated, as
everywhere (``urls.split_nodes``); ``RABBITMQ_VHOST`` then applies to each of them.

Durations (BACKOFF_DELAY, TIMEOUT) are Go durations as Knative writes them
(``50ms``, ``1m30s``, ``500µs``), which ``durations.parse_duration`` reads.

The queue already exists (the Knative controller declares it, with its own
arguments), so drop-in mode never declares it. A bad value is a
``ConfigError`` naming the variable.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from dispatcher.config.durations import LONGEST, parse_duration
from dispatcher.config.urls import split_nodes
from dispatcher.delivery.retry import Backoff
from dispatcher.errors import ConfigError

KNATIVE_DEFAULT_BACKOFF_DELAY = 0.05
DEFAULT_BACKOFF_MAX = 30.0

# key path in the settings -> the variable a user must fix
ORIGINS: Mapping[str, str] = {
    "broker.url": "RABBIT_URL",
    "bindings[0].name": "QUEUE_NAME",
    "bindings[0].queue": "QUEUE_NAME",
    "bindings[0].subscriber": "SUBSCRIBER",
    "bindings[0].parallelism": "PARALLELISM",
    "bindings[0].delivery.retry": "RETRY",
    "bindings[0].delivery.backoff_policy": "BACKOFF_POLICY",
    "bindings[0].delivery.backoff_delay": "BACKOFF_DELAY",
    "bindings[0].delivery.timeout": "TIMEOUT",
    "bindings[0].dead_letter.exchange": "DLX_NAME",
    "bindings[0].dead_letter.sink": "DEAD_LETTER_SINK",
    "bindings[0].reply.url": "BROKER_INGRESS_URL",
    "bindings[0].tls.ca_file": "SUBSCRIBER_CACERTS",
    "bindings[0].tls": "SUBSCRIBER_CACERTS",  # a file that cannot be loaded (resolve)
    "tracing.endpoint": "K_OBSERVABILITY_CONFIG",
    "tracing.sample_ratio": "K_OBSERVABILITY_CONFIG",
}


def origins(environ: Mapping[str, str]) -> Mapping[str, str]:
    """``ORIGINS`` for this environment: the broker URL comes from
    ``RABBITMQ_URL`` when that is set (it wins over ``RABBIT_URL``)."""
    if environ.get("RABBITMQ_URL"):
        return {**ORIGINS, "broker.url": "RABBITMQ_URL"}
    return ORIGINS


def wanted(environ: Mapping[str, str], config_file_exists: bool) -> bool:
    return not config_file_exists and bool(environ.get("QUEUE_NAME"))


def raw_config(environ: Mapping[str, str]) -> dict[str, Any]:
    """The raw settings dict (validated later by ``sources.settings_from_dict``)."""
    queue = environ["QUEUE_NAME"]
    delivery: dict[str, Any] = {
        "retry": _integer(environ.get("RETRY") or "0"),
        "backoff_policy": environ.get("BACKOFF_POLICY") or "exponential",
        "backoff_delay": _backoff_delay(environ.get("BACKOFF_DELAY")),
    }
    delivery["backoff_max"] = _uncapped(delivery)
    timeout = parse_duration(environ.get("TIMEOUT") or "0", "TIMEOUT")
    if timeout > 0:  # Knative's 0 means "none"; every attempt here keeps a bound
        delivery["timeout"] = timeout
    binding: dict[str, Any] = {
        "name": re.sub(r"[^A-Za-z0-9_.-]", "-", queue)[:64],
        "queue": queue,
        "subscriber": _required(environ, "SUBSCRIBER"),
        "parallelism": _integer(environ.get("PARALLELISM") or "1"),
        "delivery": delivery,
        "dead_letter": {
            "exchange": environ.get("DLX_NAME") or None,
            "sink": environ.get("DEAD_LETTER_SINK") or None,
        },
        "reply": {"url": environ.get("BROKER_INGRESS_URL") or None},
    }
    if environ.get("SUBSCRIBER_CACERTS"):
        binding["tls"] = {"ca_file": _pem_file(environ["SUBSCRIBER_CACERTS"])}
    broker_url = environ.get("RABBITMQ_URL") or _required(environ, "RABBIT_URL")
    if environ.get("RABBITMQ_VHOST"):
        broker_url = _with_vhost(broker_url, environ["RABBITMQ_VHOST"])
    raw: dict[str, Any] = {"broker": {"url": broker_url}, "bindings": [binding]}
    tracing = _tracing(environ.get("K_OBSERVABILITY_CONFIG"))
    if tracing:
        raw["tracing"] = tracing
    return raw


# Protocols Knative's observability configuration may name that are not spoken
# here ("none" is off as asked, so it needs no word).
UNSPOKEN = frozenset({"grpc", "stdout"})


def unspoken_tracing(environ: Mapping[str, str]) -> str | None:
    """The tracing protocol ``K_OBSERVABILITY_CONFIG`` asks for when this service
    cannot speak it (``UNSPOKEN``): tracing is then off unless the ``OTEL_*``
    variables turn it on, which ``advice`` says. ``None`` for anything else,
    a broken value included (``raw_config`` refuses that)."""
    try:
        tracing = _observed_tracing(environ.get("K_OBSERVABILITY_CONFIG"))
    except ConfigError:
        return None
    protocol = tracing.get("protocol")
    return protocol if protocol in UNSPOKEN else None


def _observed_tracing(text: str | None) -> dict[str, Any]:
    """The ``tracing`` object of Knative's observability configuration, ``{}``
    when there is none; ``ConfigError`` when the text is not JSON."""
    if not text:
        return {}
    try:
        config = json.loads(text)
    except ValueError:
        raise ConfigError("K_OBSERVABILITY_CONFIG", "must be a JSON object") from None
    tracing = config.get("tracing") if isinstance(config, dict) else None
    return tracing if isinstance(tracing, dict) else {}


def _tracing(text: str | None) -> dict[str, Any]:
    """The ``tracing`` section from Knative's observability configuration (the
    ``config-observability`` ConfigMap as JSON, Knative 1.19 and later). Only
    ``http/protobuf`` maps: ``grpc`` and ``stdout`` are not spoken here, and
    ``none`` is off, so those leave tracing to the ``OTEL_*`` variables."""
    tracing = _observed_tracing(text)
    if tracing.get("protocol") != "http/protobuf":
        return {}
    endpoint = tracing.get("endpoint")
    if not isinstance(endpoint, str) or not endpoint:
        raise ConfigError(
            "K_OBSERVABILITY_CONFIG", "tracing.endpoint is required for http/protobuf"
        )
    if "://" not in endpoint:
        endpoint = "https://" + endpoint  # as Knative reads it
    # Knative's endpoint is the whole URL; ours is the base /v1/traces goes after.
    endpoint = endpoint.removesuffix("/").removesuffix("/v1/traces")
    rate = tracing.get("samplingRate", 0)
    if isinstance(rate, bool) or not isinstance(rate, int | float):
        raise ConfigError("K_OBSERVABILITY_CONFIG", "tracing.samplingRate must be a number")
    # Knative: 1 or more always samples, 0 or less never.
    return {"enabled": True, "endpoint": endpoint, "sample_ratio": min(max(float(rate), 0.0), 1.0)}


def _with_vhost(urls: str, vhost: str) -> str:
    """``urls`` (one URL, or a cluster's comma-separated) with ``vhost`` in each.

    A URL with an ``@`` after what reads as its authority (a password with an
    unencoded ``/``) is left as it is: rebuilt, it would lose the rest of the
    password and the host, and the broker URL check, which refuses it with the
    whole password masked, would quote the first half of the password instead."""
    path = "/" + quote(vhost, safe="")
    return ",".join(_one_with_vhost(url, path) for url in split_nodes(urls))


def _one_with_vhost(url: str, path: str) -> str:
    parts = urlsplit(url)
    authority_end = url.find(parts.netloc) + len(parts.netloc) if parts.netloc else 0
    if "@" in url[authority_end:]:
        return url
    return urlunsplit(parts._replace(path=path))


def _pem_file(pem: str) -> str:
    """Knative passes the subscriber's CA certificates as PEM text; the TLS setting
    takes a file. The file is named by its content in a folder of this user's
    (``<tmp>/dispatcher-<uid>/``, mode 0700): every start with the same
    certificates finds it there, so restarts leave no file behind each time, and
    processes sharing it never see it removed or half written (it is renamed
    into place)."""
    try:
        data = pem.encode()
    except UnicodeError:  # undecodable bytes in the environment arrive as surrogates
        raise ConfigError("SUBSCRIBER_CACERTS", "is not UTF-8 text") from None
    folder = os.path.join(tempfile.gettempdir(), f"dispatcher-{os.getuid()}")
    path = os.path.join(folder, f"subscriber-ca-{hashlib.sha256(data).hexdigest()[:32]}.pem")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        _check_private(folder)
        if not _holds(path, data):
            _write_whole(folder, path, data)
    except OSError as e:
        raise ConfigError("SUBSCRIBER_CACERTS", f"cannot write it to a file: {e}") from e
    return path


def _holds(path: str, data: bytes) -> bool:
    try:
        with open(path, "rb") as stream:
            return stream.read() == data
    except FileNotFoundError:
        return False


def _write_whole(folder: str, path: str, data: bytes) -> None:
    """Written under a temporary name, synced, renamed: never seen half written."""
    handle, staged = tempfile.mkstemp(dir=folder, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(staged, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        raise


def _check_private(folder: str) -> None:
    """Someone else's folder (or a link to one) at our name, or one others may write
    in, could swap the file. (Reading is harmless: CA certificates are public.)"""
    status = os.lstat(folder)
    if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.getuid():
        raise OSError(f"{folder} is not a folder of this user's")
    if status.st_mode & 0o022:
        raise OSError(f"{folder} is writable by other users (mode {status.st_mode & 0o777:o})")


def _uncapped(delivery: dict[str, Any]) -> float:
    """Knative caps no backoff: make our cap the largest wait its schedule reaches."""
    retry, delay = delivery["retry"], delivery["backoff_delay"]
    if not isinstance(delay, int | float):
        return DEFAULT_BACKOFF_MAX  # validation reports a bad BACKOFF_DELAY by name
    if not isinstance(retry, int) or retry < 1:
        # No retries, but the requeue wait uses the delay too: the cap must not be below it.
        return float(max(DEFAULT_BACKOFF_MAX, delay))
    largest = Backoff(delivery["backoff_policy"], delay, math.inf).base(retry - 1)
    # Within what a duration may be (``RETRY=30`` at 1s reaches 2^29 s): past it
    # no wait of this schedule can be told apart anyway.
    return float(min(max(DEFAULT_BACKOFF_MAX, largest), LONGEST))


def _required(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name)
    if not value:
        raise ConfigError(name, "required in Knative drop-in mode (QUEUE_NAME is set)")
    return value


def _integer(text: str) -> int | str:
    """An int when the text is one; else the text, so validation names the variable."""
    try:
        return int(text.strip())
    except ValueError:
        return text


def _backoff_delay(text: str | None) -> float:
    if not text:
        return KNATIVE_DEFAULT_BACKOFF_DELAY
    seconds = parse_duration(text, "BACKOFF_DELAY")
    # Knative's dispatcher: "BackoffDelay is zero, enforcing default".
    return seconds if seconds > 0 else KNATIVE_DEFAULT_BACKOFF_DELAY
