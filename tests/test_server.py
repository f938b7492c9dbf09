"""How the stop ends an engine still starting (chat/server.py): what it freezes before killing.
The whole stop, in the app: tests/test_robustness.py."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from chat.server import freeze
from tests.conftest import ROOT, still_running

pytestmark = pytest.mark.unit

# A stand-in for one of vLLM's processes that is starting others: it starts a child every half
# millisecond (each sleeps), 1,000 in all, so that the freeze comes while it is starting one.
SPAWNING = textwrap.dedent("""
    import os, time
    for i in range(1000):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        if i == 0:  # said once a child exists: a freeze right away still finds one
            print("starting children", flush=True)
        time.sleep(0.0005)
    time.sleep(60)
""")


def in_session(leader: int) -> list[psutil.Process]:
    """The processes of the session `leader` began (everything it started, orphaned or not)."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getsid(process.pid) == leader:
                found.append(process)
    return found


@pytest.mark.parametrize("attempt", range(5))
def test_a_frozen_process_and_all_it_was_starting_are_killed_with_nothing_left(attempt):
    """Listed before the freeze, a child started in between was missed: killed without it, its
    parent left it running on its own (a process vLLM was spawning then printed an EOFError into the
    app's log, having lost its parent)."""
    parent = subprocess.Popen([sys.executable, "-c", SPAWNING], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline()  # it is starting children now
        frozen: list[psutil.Process] = []
        freeze(psutil.Process(parent.pid), frozen)
        assert len(frozen) > 1, "the freeze came before any child: it proves nothing"
        for process in frozen:
            process.kill()
        parent.wait(timeout=10)
        left = still_running(in_session(parent.pid), 10)
        assert not left, f"{len(left)} of its children ran on after the kill"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        parent.stdout.close()  # else a ResourceWarning in whichever test the collector runs next


STOPPED_IN_A_FINALIZER = """
import os, signal, sys, time
from chat.registry import EngineRegistry
from chat.server import Shutdown

shutdown = Shutdown(EngineRegistry(memory_budget=1e9), announce=False)
shutdown.install(ctrl_c=False)

class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)  # Python runs the handler here, inside the finalizer
        time.sleep(0.01)

Finalized()  # freed at once
began = time.monotonic()
shutdown.wait()
print(f"stopped after {time.monotonic() - began:.1f} s")
"""


def test_a_stop_that_lands_in_a_finalizer_still_stops_the_process_quietly():
    """A signal runs its handler wherever the main thread is, also inside a `__del__` that the garbage
    collector runs, where Python prints the handler's KeyboardInterrupt with a traceback and drops it:
    a UI worker stopped while it started went on until its supervisor killed it (chat/server.py
    `Shutdown.unraisable`)."""
    done = subprocess.run([sys.executable, "-c", STOPPED_IN_A_FINALIZER], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("stopped after"), done.stdout + done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr[-2000:]
