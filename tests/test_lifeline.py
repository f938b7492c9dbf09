"""A process the app started ends when the app is killed outright (chat/lifeline.py), in both ways:
the kernel's signal for a program of its own (Caddy), the watching thread for spawned Python.

Each test kills a stand-in for the app (a Python process that starts the child and reports its pid)
with SIGKILL, then waits for the child to end. The app itself: tests/test_workers.py."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT, running, still_running

pytestmark = pytest.mark.unit

ENDS_WITHIN_S = 20.0


def killed_parent_leaves(parent_code: str, folder: Path) -> None:
    """Run `parent_code` (which starts a child and prints its pid) as a script, SIGKILL it, and
    wait for the child to end; fails if it still runs after ENDS_WITHIN_S."""
    script = folder / "parent.py"  # a file: spawned children import their parent's script
    script.write_text(textwrap.dedent(parent_code))
    parent = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    watched = psutil.Process(int(parent.stdout.readline()))
    assert running(watched), "the child did not start"
    parent.kill()
    parent.wait()
    if still_running([watched], ENDS_WITHIN_S):  # a zombie the sandbox's init has not reaped yet has ended
        watched.kill()
        raise AssertionError(f"the child outlived its killed parent by {ENDS_WITHIN_S} s")


def test_a_program_started_with_ends_with_parent_gets_sigterm_when_its_parent_is_killed(tmp_path):
    killed_parent_leaves("""
        import subprocess, sys
        from chat.lifeline import ends_with_parent
        child = subprocess.Popen(["sleep", "600"], preexec_fn=ends_with_parent())
        print(child.pid, flush=True)
        sys.stdin.read()
    """, tmp_path)


# A spawned child: it watches its parent, says it is ready, then waits (or ignores SIGTERM first).
WATCHING_CHILD = """
    import multiprocessing, signal, sys, time

    def child(ready, ignore_term):
        from chat.lifeline import end_with_parent
        if ignore_term:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        end_with_parent(check_every_s=0.05, grace_s=0.5)
        ready.set()
        time.sleep(600)

    if __name__ == "__main__":
        spawn = multiprocessing.get_context("spawn")
        ready = spawn.Event()
        process = spawn.Process(target=child, args=(ready, {ignore_term}))
        process.start()
        print(process.pid if ready.wait(60) else -1, flush=True)
        sys.stdin.read()
"""


@pytest.mark.parametrize("ignore_term", [False, True], ids=["ends on SIGTERM", "killed after the grace period"])
def test_a_process_that_watches_its_parent_ends_when_the_parent_is_killed(ignore_term, tmp_path):
    killed_parent_leaves(WATCHING_CHILD.format(ignore_term=ignore_term), tmp_path)


# A stand-in for the app: it starts a child in its own process group, as multiprocessing does, and
# waits. The child leaves the group as every process spawned for the app does (app.py), then says so.
STARTS_A_CHILD_THAT_LEAVES = """
import subprocess, sys, time
leaves = "from chat.lifeline import leave_terminal_group; leave_terminal_group(); import os, time; " \\
         "print(os.getpid(), flush=True); time.sleep(600)"
subprocess.Popen([sys.executable, "-c", leaves])
time.sleep(600)
"""


def test_a_signal_to_the_apps_group_does_not_reach_a_process_that_left_it():
    """What a terminal's Ctrl-C sends to its foreground group ends the app alone, which then stops
    the processes it started in order (the whole stop: tests/test_stop.py)."""
    # SIGINT as a terminal's foreground program has it: tests run as a shell's background job (`&`)
    # inherit it ignored, and so would this stand-in for the app (the app sets its own handler).
    app = subprocess.Popen([sys.executable, "-c", STARTS_A_CHILD_THAT_LEAVES], cwd=ROOT, start_new_session=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert app.stdout is not None
    child = psutil.Process(int(app.stdout.readline()))
    try:
        assert os.getpgid(child.pid) == child.pid != app.pid
        os.killpg(app.pid, signal.SIGINT)
        app.wait(timeout=ENDS_WITHIN_S)
        with pytest.raises(psutil.TimeoutExpired):  # a child the signal reached would be ending now
            child.wait(1)
    finally:
        with contextlib.suppress(psutil.Error):
            child.kill()
        app.kill()
        app.wait()


FORKS_A_CHILD = """
import multiprocessing, os
from chat.lifeline import forked_processes_leave_the_group
forked_processes_leave_the_group()

def report(pipe):
    pipe.send((os.getpid(), os.getpgid(0)))

if __name__ == "__main__":
    ours, theirs = multiprocessing.get_context("fork").Pipe()
    child = multiprocessing.get_context("fork").Process(target=report, args=(theirs,))
    child.start()
    print(os.getpgid(0), *ours.recv(), flush=True)
    child.join()
"""


def test_a_process_forked_for_the_app_leaves_its_group_too():
    """vLLM forks its engine cores on a GPU, where no `__mp_main__` runs in them."""
    done = subprocess.run([sys.executable, "-c", FORKS_A_CHILD], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60, start_new_session=True)
    group, child, child_group = (int(value) for value in done.stdout.split())
    assert child_group == child != group, done.stdout + done.stderr


SPAWNS_A_CHILD = """
import atexit, multiprocessing, sys
from pathlib import Path
from chat.lifeline import spawned_processes_end_without_teardown

class Freed:
    def __init__(self, path):
        self.path = path

    def __del__(self):
        self.path.touch()

def child(folder):
    global kept
    kept = Freed(Path(folder, "freed"))  # freed only by the interpreter's teardown
    atexit.register(Path(folder, "atexit").touch)
    sys.exit(3)

if __name__ == "__mp_main__" and sys.argv[2] == "without teardown":
    spawned_processes_end_without_teardown()

if __name__ == "__main__":
    process = multiprocessing.get_context("spawn").Process(target=child, args=(sys.argv[1],))
    process.start()
    process.join()
    print(process.exitcode)
"""


@pytest.mark.parametrize("how", ["without teardown", "as multiprocessing ends it"])
def test_a_spawned_process_ends_without_freeing_every_object_but_runs_its_exit_handlers(tmp_path, how):
    """An engine core's stop no longer waits for Python to free torch and vLLM object by object
    (chat/lifeline.py `spawned_processes_end_without_teardown`); its exit handlers and status stay."""
    script = tmp_path / "parent.py"  # a file: the spawned child imports it as __mp_main__
    script.write_text(SPAWNS_A_CHILD)
    done = subprocess.run([sys.executable, str(script), str(tmp_path), how], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert done.stdout.split() == ["3"], done.stdout + done.stderr
    assert (tmp_path / "atexit").exists(), "the child's exit handlers did not run"
    assert (tmp_path / "freed").exists() == (how != "without teardown"), done.stderr
