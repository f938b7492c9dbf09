"""Every process the app starts ends with the app, also when the app is killed outright.

A stop by signal lets the app end what it started (chat/server.py, chat/supervisor.py); SIGKILL, the
out-of-memory killer or a crash do not, and the engine cores kept their memory (a GPU's) and Caddy
the public port. So every process multiprocessing starts for the app (UI workers, vLLM's engine
cores and their workers) imports app.py as `__mp_main__`, which calls `end_with_parent()`; a process
vLLM forks does the same (`forked_processes_leave_the_group`). The UI workers' parent is the server
they are forked from (chat/supervisor.py), which watches the app in turn (chat/worker_server.py);
Caddy gets SIGTERM from the kernel (`ends_with_parent`).

A terminal's Ctrl-C, and a stop that signals the app's process group, reached every process at
once: vLLM's worker quit, its core saw it die (two tracebacks), the app began a restart, and shared
memory was left to the resource tracker ("leaked"). So each process the app starts leaves the group
(`leave_terminal_group`; Caddy: chat/front_door.py), and the main process alone stops them, in order:
requests aborted, each engine shut down, then the server closed.

Each of them, the app included, ends without Python's teardown once its work is done
(`exit_without_teardown`, `spawned_processes_end_without_teardown`): freeing torch's, vLLM's and
Gradio's objects one by one took seconds of every stop, and nobody needs them freed.
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
from multiprocessing.process import BaseProcess
from typing import Any, NoReturn

CHECK_EVERY_S = 1.0
GRACE_S = 10.0
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def end_with_parent(check_every_s: float = CHECK_EVERY_S, grace_s: float = GRACE_S) -> None:
    """Once this process's parent is gone (it then has another parent), SIGTERM this process (it
    ends what it started in turn), and SIGKILL it `grace_s` later if it still runs."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(check_every_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="end with parent", daemon=True).start()


def leave_terminal_group() -> None:
    """Lead a process group of this process's own, which what it starts joins. Called first thing in
    a spawned process: a signal to the app's group before this (a fraction of a second) still reaches it."""
    with contextlib.suppress(OSError):  # already a session leader: it cannot leave, nor need to
        os.setpgid(0, 0)


def forked_processes_leave_the_group() -> None:
    """On a GPU, vLLM forks its engine cores and their workers (unless CUDA is initialised), and a
    forked process imports no `__mp_main__`: it leaves the group and watches its parent as it is forked."""
    os.register_at_fork(after_in_child=_forked)


def _forked() -> None:
    leave_terminal_group()
    end_with_parent()


def ends_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen: the child gets SIGTERM when this process ends (Linux's
    PR_SET_PDEATHSIG, tied to the thread that starts it: start it from the main thread); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def in_child() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the app ended before the line above: nothing will signal
            os._exit(1)

    return in_child


def spawned_processes_end_without_teardown() -> None:
    """In a process multiprocessing spawned (an engine core, its worker, a UI worker): once its target
    has returned, end as `exit_without_teardown` does. multiprocessing's spawned child ends with
    `sys.exit`, which then frees every object of torch and vLLM one by one: ~1 s of an engine core's stop
    on an idle 2-core Xeon, far more on a busy one, where a core that had not ended after CORE_STOP_S
    was killed by vLLM with two warnings (a forked child ends with `os._exit` already). Called as the
    child imports `__mp_main__`, before multiprocessing runs its target (`BaseProcess._bootstrap`)."""
    bootstrap = BaseProcess._bootstrap  # type: ignore[attr-defined]

    def bootstrap_then_exit(self: BaseProcess, *args: Any, **kwargs: Any) -> NoReturn:
        exit_without_teardown(bootstrap(self, *args, **kwargs))

    BaseProcess._bootstrap = bootstrap_then_exit  # type: ignore[attr-defined]


def exit_without_teardown(status: int) -> NoReturn:
    """End this process as Python's exit does (threads joined, exit handlers run: children ended,
    logs flushed, temporary files removed) but without freeing every object and module one by one:
    with torch, vLLM and Gradio loaded that took ~2 s of every stop on a 2-core Xeon (CHANGELOG)."""
    getattr(threading, "_shutdown", lambda: None)()  # the first step of Python's own exit
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
