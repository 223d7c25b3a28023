"""Launch the dispatcher from a source checkout: ``python cmd/dispatcher.py run``.

Wiring only; everything lives in ``dispatcher.cli``. ``cmd/`` has no
``__init__.py`` on purpose: a package named ``cmd`` would shadow the standard
library module of that name.
"""

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
# Python puts this script's folder first on sys.path, where ``dispatcher.py``
# (this file) would shadow the ``dispatcher`` package: put the repo root there.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_ROOT))

from dispatcher.cli import main  # noqa: E402

raise SystemExit(main())
