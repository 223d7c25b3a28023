"""The ``filters`` key's entries as the service reads them: frozen dataclasses.

``values.filters`` builds them from the file; ``dispatcher.delivery.filters`` turns
them into predicates; ``render`` writes them back as the file had them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MatchDialect = Literal["exact", "prefix", "suffix"]
NestingDialect = Literal["all", "any", "not"]


@dataclass(frozen=True, slots=True)
class MatchFilter:
    """One ``filters`` entry comparing attributes: every one listed must match."""

    dialect: MatchDialect
    attributes: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class NestingFilter:
    """One ``filters`` entry combining others (``not`` holds exactly one)."""

    dialect: NestingDialect
    filters: tuple[FilterEntry, ...]


@dataclass(frozen=True, slots=True)
class CesqlFilter:
    """One ``filters`` entry holding a CloudEvents SQL expression (checked to compile)."""

    expression: str
    dialect: Literal["cesql"] = "cesql"


FilterEntry = MatchFilter | NestingFilter | CesqlFilter
