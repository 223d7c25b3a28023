"""``python -m dispatcher``: the same program as the ``dispatcher`` command."""

from dispatcher.cli import main

raise SystemExit(main())
