"""Scheduling priority for the front-end benchmark's processes on a machine others are using.

With the kernel's autogroups (`/proc/sys/kernel/sched_autogroup_enabled`), CPU time is shared
fairly between sessions first and by nice value only within a session, so a process's own nice
value does not put it ahead of other sessions' work: its session's autogroup nice value does.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

AUTOGROUP = Path("/proc/self/autogroup")


def prioritize(nice: int) -> Callable[[], None]:
    """This process (and what it starts later) at `nice`, both as a process and as its session's
    autogroup. Negative values need the right to raise priority (root). Returns what puts the
    session's autogroup back (other processes of the session share it)."""
    os.setpriority(os.PRIO_PROCESS, 0, nice)
    try:  # "/autogroup-10 nice 0"
        before = int(AUTOGROUP.read_text().split()[-1])
        AUTOGROUP.write_text(str(nice))
    except (OSError, ValueError, IndexError):  # no autogroups on this kernel, or not allowed
        return lambda: None

    def restore() -> None:
        with contextlib.suppress(OSError):
            AUTOGROUP.write_text(str(before))

    return restore
