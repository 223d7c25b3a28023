"""Valid settings that are probably not what the user meant: said by ``check`` and ``run``.

Each is a key and a sentence. ``dispatcher check`` prints them on stderr (and
still exits 0: the configuration is valid); ``dispatcher run`` logs them as
warnings once at start.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from dispatcher import cesql
from dispatcher.config.settings import CesqlFilter, FilterEntry, NestingFilter, Settings


@dataclass(frozen=True, slots=True)
class Advice:
    key: str
    text: str

    def __str__(self) -> str:
        return f"{self.key}: {self.text}"


def advice(settings: Settings) -> list[Advice]:
    found: list[Advice] = []
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
    return found


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
