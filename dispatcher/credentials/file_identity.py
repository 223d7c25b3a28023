"""When a file kept current from disk has changed: its identity as ``stat`` sees it.

Device, inode, size, modification and change times: Kubernetes rotates a
projected token or a Secret by swapping a symlink, which changes the inode. A
file rewritten in place within the filesystem's timestamp granularity (a few
milliseconds) could keep every one of those, so a file whose modification time
is within ``RACY_SECONDS`` of the clock has no steady identity yet (``None``):
it counts as changed until it is steady, git's rule for "racily clean"
files. Used for the bearer token file (a ``stat`` per request) and the
broker's TLS files (a ``stat`` per connect).
"""

from __future__ import annotations

import os
from typing import Final

RACY_SECONDS: Final = 2.0

Identity = tuple[int, int, int, int, int]


def steady(st: os.stat_result, now: float) -> Identity | None:
    """``st``'s identity, or None for a file modified so close to ``now`` (wall
    clock) that a rewrite in the same timestamp tick could follow unseen. A clock
    stepped back makes a file look modified in the future: that too ends when the
    clock has passed it by ``RACY_SECONDS``."""
    if abs(now - st.st_mtime_ns / 1e9) < RACY_SECONDS:
        return None
    return identity(st)


def identity(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
