"""The configuration reference (``docs/configuration-keys.md``), generated from the models.

One row per key: its path, its default as ``check`` writes it, and its
description. A unit test fails when the checked-in page differs, so the page
cannot drift from what the service reads.

    python -m dispatcher.config.reference           # rewrite the page
    python -m dispatcher.config.reference --check   # exit 1 when it is out of date
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from dispatcher.config.generated import refresh
from dispatcher.config.problems import section_in
from dispatcher.config.render import rendered_default
from dispatcher.config.settings import Settings

PAGE: Final = Path("docs/configuration-keys.md")
REGENERATE: Final = "make schema"

_HEAD: Final = """\
# Configuration keys

Every key of the config file, generated from the models in
`dispatcher/config/settings.py` by `{regenerate}`;
a test fails when this page differs from them. `config/dispatcher.example.yaml` shows them in a
file, with the forms each accepts; `null` for a key means its default.

| key | default | what it is |
|---|---|---|
"""


def rows(shape: type[BaseModel] = Settings, prefix: str = "") -> Iterator[str]:
    for name, f in shape.model_fields.items():
        path = f"{prefix}{name}"
        nested = section_in(f.annotation)
        if nested is None:
            yield f"| `{path}` | {_default(f)} | {f.description or ''} |"
            continue
        listed = get_origin(f.annotation) is tuple
        yield f"| `{path}` | {'required' if listed else _section_default(f)} | {_doc(nested)} |"
        yield from rows(nested, f"{path}[]." if listed else f"{path}.")


def _default(f: FieldInfo) -> str:
    if f.is_required():
        return "required"
    return f"`{json.dumps(rendered_default(f), ensure_ascii=False)}`"


def _section_default(f: FieldInfo) -> str:
    return "`null` (none)" if f.default is None else "its keys' defaults"


def _doc(shape: type[BaseModel]) -> str:
    return " ".join((shape.__doc__ or "").split()) if shape.__doc__ else ""


def page() -> str:
    return _HEAD.format(regenerate=REGENERATE) + "\n".join(rows()) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dispatcher.config.reference",
        description="Regenerate docs/configuration-keys.md from the settings models.",
    )
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--check", action="store_true", help="exit 1 when out of date")
    args = parser.parse_args(argv)
    return refresh(args.page, page(), check=args.check, regenerate=REGENERATE)


if __name__ == "__main__":
    sys.exit(main())
