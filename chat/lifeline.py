"""Every process the app starts ends with the app, also when the app is killed outright.

A stop by signal lets the app end what it started (chat/server.py, chat/supervisor.py). SIGKILL,
the kernel's out-of-memory killer or a crash leave it no chance: the engine cores kept running,
holding their memory (a GPU's, on a GPU), and Caddy kept the public port, so the next start could
not listen there. Now:

- every process that multiprocessing spawns for the app (the UI workers, vLLM's engine cores and
  their workers, wherever vLLM spawns them: always on a CPU; on a GPU it forks them unless CUDA is
  initialised; `forked_processes_leave_the_group` does the same in a forked one) imports app.py as
  `__mp_main__`, which calls `end_with_parent()`: a thread that notices when the process that started this one is gone, and
  then stops this one as SIGTERM does (each ends what it started in turn), or kills it if that has
  not ended it within `GRACE_S`;
- Caddy, a program of its own, gets SIGTERM from the kernel when the app's process ends
  (`ends_with_parent`, Linux's PR_SET_PDEATHSIG; Caddy is started from the main thread, which the
  signal is tied to).

The app's main process also owns the stop. A terminal's Ctrl-C sends SIGINT to its whole foreground
process group, and a stop may signal the group too: every process that got it then stopped on its
own, in any order. vLLM's worker quit at once, its engine core saw it die (ERROR, two tracebacks),
the app saw the core die and began a restart, and the shared memory between them was left to
multiprocessing's resource tracker (a "leaked" warning). So each process the app starts leaves
the group it was started in (`leave_terminal_group`; Caddy: chat/front_door.py), and a signal to
the group reaches the main process only, which stops them in order: the requests in flight
aborted, each engine shut down, then the server closed (chat/server.py, chat/supervisor.py).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

CHECK_EVERY_S = 1.0
GRACE_S = 10.0
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def end_with_parent(check_every_s: float = CHECK_EVERY_S, grace_s: float = GRACE_S) -> None:
    """Watch this process's parent from a daemon thread; once it is gone (this process then has
    another parent), SIGTERM this process, and SIGKILL it `grace_s` later if it still runs."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(check_every_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="end with parent", daemon=True).start()


def leave_terminal_group() -> None:
    """Make this process the leader of a process group of its own (what it starts joins it), so that
    a signal to the app's group does not reach it: the app stops it in order instead. Called first
    thing in a spawned process; a signal that comes before this still reaches it (the start of the
    interpreter, a fraction of a second after the engine or worker is started)."""
    with contextlib.suppress(OSError):  # already a session leader: it cannot leave, nor need to
        os.setpgid(0, 0)


def forked_processes_leave_the_group() -> None:
    """On a GPU, vLLM forks its engine cores and their workers (unless CUDA is initialised), and a
    forked process imports no `__mp_main__`: it leaves the group and watches its parent as it is
    forked instead. (A subprocess that runs a program, such as Caddy, is not forked this way.)"""
    os.register_at_fork(after_in_child=_forked)


def _forked() -> None:
    leave_terminal_group()
    end_with_parent()


def ends_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen: the child gets SIGTERM when this process ends (None
    where the kernel cannot do that: not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def in_child() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the app ended before the line above: nothing will signal
            os._exit(1)

    return in_child


def exit_without_teardown(status: int) -> NoReturn:
    """End this process as Python's exit does (threads that are not daemons joined, the exit handlers
    run: the app's children ended, logs flushed, temporary files removed), but without then freeing
    every object and module one by one: with torch, vLLM and Gradio loaded that took ~2 s of every
    stop on a 2-core Xeon (CHANGELOG), and nothing it would do outlives the process."""
    getattr(threading, "_shutdown", lambda: None)()  # the first step of Python's own exit
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
