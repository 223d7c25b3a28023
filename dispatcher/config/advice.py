"""Valid settings that are probably not what the user meant: said by ``check`` and ``run``.

Each is a key and a sentence. ``dispatcher check`` prints them on stderr (and
still exits 0: the configuration is valid); ``dispatcher run`` logs them as
warnings once at start.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from dispatcher import cesql
from dispatcher.config import knative, otel
from dispatcher.config.filter_tree import CesqlFilter, FilterEntry, NestingFilter
from dispatcher.config.redaction import redact_url
from dispatcher.config.settings import UNACKED_MAX, BindingSettings, Settings, TlsSettings
from dispatcher.delivery.retry import JITTER, Backoff


@dataclass(frozen=True, slots=True)
class Advice:
    key: str
    text: str

    def __str__(self) -> str:
        return f"{self.key}: {self.text}"


def advice(settings: Settings, environ: Mapping[str, str] | None = None) -> list[Advice]:
    """What to say of ``settings``, read from ``environ`` (the process's variables)."""
    found: list[Advice] = []
    protocol = knative.unspoken_tracing(environ or {})
    if protocol is not None and not settings.tracing.enabled:
        found.append(
            Advice(
                "K_OBSERVABILITY_CONFIG",
                f"asks for tracing over {protocol}, which this dispatcher does not speak "
                "(only http/protobuf): tracing is off",
            )
        )
    signal = (environ or {}).get(otel.TRACES_ENDPOINT)
    if signal and settings.tracing.enabled:
        found.append(
            Advice(
                "tracing.endpoint",
                f"is not used: {otel.TRACES_ENDPOINT} sends the spans to {redact_url(signal)}",
            )
        )
    found.extend(_unused_tls(settings))
    for index, binding in enumerate(settings.bindings):
        key = f"bindings[{index}]"
        dead_letter = binding.dead_letter
        if dead_letter.sink is None and dead_letter.exchange is None:
            found.append(
                Advice(
                    f"{key}.dead_letter",
                    f"binding {binding.name!r} has no dead-letter target: an event that "
                    "cannot be delivered is rejected, and only the queue's own dead-letter "
                    "exchange (a broker policy or declare.dead_letter_exchange) keeps it; "
                    "without one the broker discards it",
                )
            )
        if binding.filters and binding.filter is not None:
            found.append(Advice(f"{key}.filter", "is ignored: filters is set (as in Knative)"))
        for place, entry in enumerate(binding.filters):
            found.extend(_ungrouped(entry, f"{key}.filters[{place}]"))
        found.extend(_window_too_long(binding, key))
        found.extend(_limit_discards(binding, key))
        found.extend(_rate_too_low(binding, key))
    return found


def _unused_tls(settings: Settings) -> Iterator[Advice]:
    """TLS files given where no URL is TLS: read by nothing, said by nothing."""
    if _names_files(settings.broker.tls) and not settings.broker.uses_tls:
        yield Advice("broker.tls", "is not used: no broker.url is amqps://")
    for index, binding in enumerate(settings.bindings):
        targets = (binding.subscriber, binding.dead_letter.sink, binding.reply.url)
        if _names_files(binding.tls) and not any(
            url is not None and url.lower().startswith("https://") for url in targets
        ):
            yield Advice(
                f"bindings[{index}].tls",
                "is not used: none of the binding's URLs (subscriber, dead-letter sink, "
                "reply URL) is https://",
            )


def _names_files(tls: TlsSettings) -> bool:
    return any(path is not None for path in (tls.ca_file, tls.cert_file, tls.key_file))


def fastest_retries(binding: BindingSettings) -> float:
    """The least time a message can take to spend every retry: each attempt failing
    at once (a refused connection), each backoff at its shortest jitter."""
    d = binding.delivery
    backoff = Backoff(d.backoff_policy, d.backoff_delay, d.backoff_max)
    return sum((1.0 - JITTER) * backoff.base(n) for n in range(d.retry))


def _rate_too_low(binding: BindingSettings, key: str) -> Iterator[Advice]:
    """Every held message waits its turn for a rate-limit slot, unacked: the last of
    ``prefetch`` waits ``prefetch / rate_limit``, and the broker closes the channel
    of a message unacked past its consumer_timeout (30 min by default)."""
    rate = binding.delivery.rate_limit
    held = binding.effective_prefetch
    if rate is None or held / rate < UNACKED_MAX:
        return
    yield Advice(
        f"{key}.delivery.rate_limit",
        f"binding {binding.name!r}: {held} messages held at {rate:g} requests/s "
        f"wait up to {_seconds(held / rate)} for their turn, unacked; the broker "
        "closes a channel whose message stays unacked past its consumer_timeout (30 min "
        "by default): lower prefetch and parallelism, or raise the limit",
    )


def _seconds(value: float) -> str:
    return f"{round(value, 3):g}s"


def _window_too_long(binding: BindingSettings, key: str) -> Iterator[Advice]:
    """A breaker saves messages only if it opens before they run out of retries;
    at an outage's start its window still holds the successes before it."""
    breaker = binding.circuit_breaker
    if breaker is None:
        return
    fastest = fastest_retries(binding)
    if fastest < breaker.window:
        yield Advice(
            f"{key}.circuit_breaker.window",
            f"binding {binding.name!r}: a message can spend its {binding.delivery.retry + 1} "
            f"attempts in {_seconds(fastest)}, less than the window of "
            f"{_seconds(breaker.window)}: at the start of an outage, messages may be "
            "dead-lettered before the breaker opens (a shorter window, or more retries or "
            "a longer backoff)",
        )


def _limit_discards(binding: BindingSettings, key: str) -> Iterator[Advice]:
    """A quorum queue's delivery limit with nowhere to send what reaches it: the
    broker discards a message returned that often, and a binding does return
    messages (dead-letter targets all down, shutdown, a lost channel)."""
    declare = binding.declare
    if declare is None or declare.delivery_limit is None or declare.dead_letter_exchange:
        return
    yield Advice(
        f"{key}.declare.delivery_limit",
        f"binding {binding.name!r}: the broker discards a message returned to the queue "
        f"{declare.delivery_limit} times, and messages are returned while every dead-letter "
        "target is down, at shutdown and when a channel is lost; set "
        "declare.dead_letter_exchange to keep them",
    )


def _ungrouped(entry: FilterEntry, where: str) -> Iterator[Advice]:
    """CESQL expressions that mix AND, OR and XOR without parentheses."""
    if isinstance(entry, CesqlFilter):
        if cesql.parse(entry.expression).ungrouped_logic:
            yield Advice(
                f"{where}.cesql",
                "mixes AND, OR or XOR without parentheses: CESQL reads them left to right, "
                "Knative's filter right to left; add parentheses so that both read it the same",
            )
    elif isinstance(entry, NestingFilter):
        if entry.dialect == "not":
            yield from _ungrouped(entry.filters[0], f"{where}.not")
        else:
            for index, inner in enumerate(entry.filters):
                yield from _ungrouped(inner, f"{where}.{entry.dialect}[{index}]")
