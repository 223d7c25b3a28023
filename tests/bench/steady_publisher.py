"""W2's publisher, a process of its own: publishes the ids in ``--ids`` at ``--rate`` msg/s.

Kept out of the bench's process so that the bench's polling never holds the
GIL between an event's timestamp (``ce-benchpublished``) and its publication.
Exits 0 once every event was published (a traceback and 1 otherwise).

    python tests/bench/steady_publisher.py --queue Q --ids FILE --rate 1000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench import queues

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--queue", required=True)
    parser.add_argument("--ids", required=True)
    parser.add_argument("--rate", type=float, required=True)
    args = parser.parse_args()
    queues.publish_steady(args.queue, Path(args.ids).read_text().split(), args.rate)
