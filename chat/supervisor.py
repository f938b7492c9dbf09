"""Several UI processes on the app's engines, behind one port: `python app.py --ui-workers N`.

Gradio runs every event of a process on one event loop, and at a few hundred simultaneous readers
that loop, not the engine, sets the pace (docs/benchmarks.md, "Front-end capacity"). vLLM's own
server scales out the same way (`vllm serve --api-server-count`): each engine core starts once and
every front-end process holds a client of it. The supervisor runs:

    browsers ─> Caddy on the public port (chat/front_door.py) ─> UI worker i (Gradio; a client of each core it uses) ─┐
                                                               ─> UI worker j ...                                   ─┴─> engine cores
                                   the engine owner (chat/owner.py): starts, wakes, puts to sleep, unloads, restarts every core

A worker that dies is replaced on its port while the others keep serving (the front door sends its
visitors elsewhere meanwhile; their pages start a new session); Caddy is started again if it stops.
Every process writes its metrics to one folder (prometheus_client's multiprocess mode), so
`/metrics` from any worker is the whole app's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import multiprocessing
import os
import resource
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING

from chat import logs
from chat.errors import PresetError, first_line
from chat.front_door import FrontDoor
from chat.presets import PresetCatalog

if TYPE_CHECKING:  # imported where used: chat.control imports prometheus_client, which must see its folder first
    from chat.control import WorkerState
    from chat.engine import Engine

log = logging.getLogger("chat.supervisor")

STOP_WAIT_S = 15.0
FRONT_DOOR_START_S = 10.0
# What the worker server (multiprocessing's forkserver) imports once, before it forks each UI worker:
# chat.worker_server first (it joins the app's lifeline), then Gradio and the page's modules (chat.ui
# before Gradio: chat/ui/gradio_import.py must see Gradio load), then vLLM's front end. Spawned, each
# worker imported them itself: ~15 s of CPU a worker on the 2-core EPYC, and a replaced worker served
# that much later. A name that fails to import is skipped there (the worker imports it as before).
WORKER_IMPORTS = ("chat.worker_server", "chat.ui", "chat.server", "vllm.v1.engine.async_llm")


def private_port() -> socket.socket:
    """A socket bound to a free loopback port, not listening: a worker listens on it, and it stays
    bound here for as long as the app runs. Bound without SO_REUSEADDR, it keeps every other program
    off the port, also while no worker listens, so the front door only ever reaches this app's workers."""
    while True:
        with socket.socket() as chooser:
            chooser.bind(("127.0.0.1", 0))
            port = chooser.getsockname()[1]
        bound = socket.socket()
        try:
            bound.bind(("127.0.0.1", port))  # a port number, not 0, so it stays bound through shutdown()
            return bound
        except OSError:  # taken in between: choose again
            bound.close()


def port_is_free(host: str, port: int) -> str | None:
    """None when `host:port` can be listened on; otherwise why not, in words."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


async def listening(host: str, port: int, alive: Callable[[], bool], within_s: float = float("inf")) -> bool:
    """Whether something listens on `host:port` before `alive()` turns false or `within_s` pass."""
    deadline = time.monotonic() + within_s
    while alive() and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            writer = (await asyncio.open_connection(host, port))[1]
            writer.close()
            return True
        await asyncio.sleep(0.1)
    return False


def run_worker(args: argparse.Namespace, index: int, folder: Path, port: socket.socket) -> None:
    """A UI worker's process: chat/server.py listening on `port`, the private port in `args`."""
    from chat.lifeline import exit_without_teardown
    from chat.presets import load_presets
    from chat.server import Worker, serve

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor stops us (a Ctrl-C sent to us alone too)
    logs.configure(verbose=args.verbose)
    # As the app's own process ends: Python's teardown of what a worker imported took ~4 s of every stop.
    exit_without_teardown(serve(args, load_presets(args.presets_dir), Worker(index, folder, port)))


@dataclass
class WorkerProcess:
    index: int
    bound: socket.socket  # private_port()
    state: WorkerState
    process: BaseProcess | None = None

    def __post_init__(self) -> None:
        # Read once: a socket that has stopped listening reports port 0 until it listens again.
        self.port = int(self.bound.getsockname()[1])


class Supervisor:
    """Runs the engine owner, the front door and the workers, and acts on what happens to them:
    a process that ends (its sentinel, or a thread that waits for Caddy), a worker whose first
    engine start has ended (the owner says so), a stop signal."""

    def __init__(self, args: argparse.Namespace, catalog: PresetCatalog, count: int, caddy: Path,
                 folder: Path) -> None:
        from chat.control import WorkerState, WorkerView, background
        from chat.owner import EngineOwner
        from chat.server import memory_budget

        self.args, self.catalog, self.caddy, self.folder = args, catalog, caddy, folder
        self.workers = [WorkerProcess(i, private_port(), WorkerState.STARTING) for i in range(count)]
        self.stopping = asyncio.Event()
        self.ending = False  # the workers and the front door stop now: not started again
        self.forks = multiprocessing.get_context("forkserver")  # the worker server: start_worker_server()
        self.front = FrontDoor(args.host, args.port, [w.port for w in self.workers], folder)
        self.owner = EngineOwner(catalog, folder, count, memory_budget(args), args.max_waiting)
        self.owner.worker_states = lambda: [WorkerView(index=w.index, state=w.state) for w in self.workers]
        self.owner.on_settled = lambda index: background(self.serving(self.workers[index]))
        self.url = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}/"
        self.default = catalog.get(args.preset)
        self.first: Engine | None = None
        self.announced = False

    async def run(self) -> int:
        from chat.server import end_starting_engines

        loop = asyncio.get_running_loop()

        def stop() -> None:
            if not self.stopping.is_set():
                print(logs.STOPPING, flush=True)
            self.stopping.set()

        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop)
        if (problem := port_is_free(self.args.host, self.args.port)) is not None:
            print(f"Cannot listen on {self.args.host}:{self.args.port} ({problem}); pick another --port.", file=sys.stderr)
            return 2
        engines = self.owner.registry
        serving = loop.create_task(self.owner.serve(), name="engine owner")
        self.first = engines.start(self.default)
        print(f"Starting {len(self.workers)} UI workers; the page will be at {self.url}", flush=True)
        front = None
        try:
            if not await self.open_front_door():
                return 2
            front = loop.create_task(self.keep_front_door())
            for worker in self.workers:
                self.start_worker(worker)
            await self.stopping.wait()
            return 0
        finally:
            self.ending = engines.closing = True  # no engine start begins while the workers stop
            started = time.monotonic()
            self.front.stop()
            if front is not None:
                front.cancel()
            await asyncio.to_thread(self.stop_workers)
            await self.owner.close()
            end_starting_engines(engines)  # cut short: the exit would wait for each whole start
            serving.cancel()
            if self.stopping.is_set():
                print(logs.stopped_line(time.monotonic() - started), flush=True)

    async def open_front_door(self) -> bool:
        self.front.start(self.caddy)
        host = "127.0.0.1" if self.args.host in ("0.0.0.0", "::") else self.args.host
        # Caddy says nothing when it listens: ask its port.
        if await listening(host, self.args.port, lambda: self.front.alive, FRONT_DOOR_START_S) or self.front.alive:
            return True
        code = self.front.process.returncode if self.front.process else None
        print(f"The front door (Caddy) could not start on {self.args.host}:{self.args.port} (exit code {code}; "
              "its message is above); pick another --port, or start with --ui-workers 1.", file=sys.stderr)
        return False

    async def keep_front_door(self) -> None:
        """Start the front door again whenever it stops (a thread waits for its process)."""
        while self.front.process is not None:
            code = await asyncio.to_thread(self.front.process.wait)
            if self.ending:
                return
            log.error("The front door (Caddy) stopped (exit code %s); starting it again", code)
            await asyncio.sleep(1.0)  # not in a tight loop where it cannot start
            await self.open_front_door()

    def start_worker(self, worker: WorkerProcess) -> None:
        """Fork a worker's process from the worker server (WORKER_IMPORTS), on a thread: the first
        start waits while that server imports (seconds), which the event loop must not."""
        if self.ending:
            return
        worker_args = argparse.Namespace(**{**vars(self.args), "host": "127.0.0.1", "port": worker.port, "share": False})
        # The socket travels to the new process as a duplicated descriptor (multiprocessing's reduction).
        process = self.forks.Process(target=run_worker, args=(worker_args, worker.index, self.folder, worker.bound),
                                     name=f"UIWorker-{worker.index}")
        loop = asyncio.get_running_loop()

        def start() -> None:
            try:
                process.start()
            except (OSError, EOFError) as exc:  # the worker server ended (the app stops) or could not start
                then: functools.partial[None] = functools.partial(self.worker_not_started, worker, exc)
            else:
                then = functools.partial(self.worker_started, worker, process)
            with contextlib.suppress(RuntimeError):  # the event loop has closed: the app has stopped
                loop.call_soon_threadsafe(then)

        # A daemon thread, not the loop's executor: a stop must not wait for the server's imports.
        threading.Thread(target=start, name=f"start UI worker {worker.index}", daemon=True).start()

    def worker_started(self, worker: WorkerProcess, process: BaseProcess) -> None:
        if self.ending:  # started as the app stopped: stop_workers did not see it
            process.terminate()
            return
        worker.process = process
        asyncio.get_running_loop().add_reader(process.sentinel, self.worker_ended, worker, process)

    def worker_not_started(self, worker: WorkerProcess, exc: BaseException) -> None:
        if self.ending:
            return
        log.error("UI worker %d could not start (%s); trying again in 1 s", worker.index, first_line(exc) or type(exc).__name__)
        asyncio.get_running_loop().call_later(1.0, self.start_worker, worker)

    def worker_ended(self, worker: WorkerProcess, process: BaseProcess) -> None:
        """A worker's process ended: its port refuses at once, and another starts on it."""
        from prometheus_client import multiprocess

        from chat import metrics
        from chat.control import WorkerState

        asyncio.get_running_loop().remove_reader(process.sentinel)
        if self.ending:
            return
        # Read now, on this thread: the worker server has written the exit status to the sentinel's pipe
        # (which woke us), and it can be read once: the next start's poll of every child (multiprocessing's
        # own, on the starting thread) read it first in a fresh run and left "exit code 255" here.
        code = process.exitcode
        if process.pid is not None:  # its gauges no longer count in the whole app's sums
            multiprocess.mark_process_dead(process.pid)
        # Refuse connections (the front door then tries another worker at once), but stay bound until
        # the replacement listens: the worker listened with SO_REUSEADDR (chat/ui/gradio_internals.py,
        # serve_on); without it again, the bound socket keeps every other program off the port meanwhile.
        with contextlib.suppress(OSError):  # not listening
            worker.bound.shutdown(socket.SHUT_RD)
        worker.bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        log.error("UI worker %d stopped (exit code %s); starting another", worker.index, code)
        worker.state = WorkerState.RESTARTING
        metrics.UI_WORKER_UP.labels(str(worker.index)).set(0)
        self.owner.forget(worker.index)
        self.start_worker(worker)

    async def serving(self, worker: WorkerProcess) -> None:
        """A worker whose first engine start has ended serves once it listens (at once, as a rule)."""
        from chat import metrics
        from chat.control import WorkerState

        process = worker.process
        if process is None or not await listening("127.0.0.1", worker.port,
                                                  lambda: process is worker.process and process.is_alive()):
            return
        worker.state = WorkerState.SERVING
        metrics.UI_WORKER_UP.labels(str(worker.index)).set(1)
        log.info("UI worker %d serving (process %s)", worker.index, process.pid)
        self.owner.news()
        if not self.announced and self.first is not None and self.first.ready_at is not None and all(
                w.state is WorkerState.SERVING for w in self.workers):
            print(logs.ready_line(self.default.name, self.url), flush=True)
            self.announced = True

    def stop_workers(self) -> None:
        from chat.control import WorkerState

        processes = [w.process for w in self.workers if w.process is not None]
        for worker in self.workers:
            worker.state = WorkerState.STOPPED
        for process in processes:
            process.terminate()
        deadline = time.monotonic() + STOP_WAIT_S
        for process in processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()


def supervise(args: argparse.Namespace, catalog: PresetCatalog, count: int, caddy: Path) -> int:
    """Serve every preset with `count` UI workers behind Caddy (the binary at `caddy`); the exit status."""
    from chat.server import end_children

    folder = Path(tempfile.mkdtemp(prefix="vllm-chat-"))
    os.chmod(folder, 0o700)  # only this user: the owner's socket and the engine cores' sockets
    # Before anything imports prometheus_client, in this process and the ones it starts.
    (metrics_dir := folder / "metrics").mkdir()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    try:
        start_worker_server()
        return supervise_in(folder, args, catalog, count, caddy)
    finally:
        end_children()
        shutil.rmtree(folder, ignore_errors=True)


def start_worker_server() -> None:
    """Start the server the UI workers are forked from now: its imports (WORKER_IMPORTS, ~15 s of CPU)
    run beside this process's own, not after them."""
    from multiprocessing import forkserver

    forkserver.set_forkserver_preload(list(WORKER_IMPORTS))
    forkserver.ensure_running()


def supervise_in(folder: Path, args: argparse.Namespace, catalog: PresetCatalog, count: int, caddy: Path) -> int:
    """`supervise`, in the app's folder, once the worker server starts."""
    from chat.engine_vllm import UntestedVllm, check_version
    from chat.shedding import front_door_warning

    try:
        check_version(args.allow_untested_vllm)  # here once: the UI workers do not check again
        catalog.get(args.preset)
    except UntestedVllm as exc:
        print(exc, file=sys.stderr)
        return 2
    except PresetError as exc:
        print(f"{exc.message} Pick another with --preset; --list-presets shows them.", file=sys.stderr)
        return 2
    for problem in catalog.problems.values():
        log.warning("Preset unavailable: %s", problem)
    if args.share:
        log.warning("--share makes no public link with several UI workers (Gradio's link reaches one process); "
                    "publish the front door's port yourself, or use --ui-workers 1.")
    if warning := front_door_warning(resource.getrlimit(resource.RLIMIT_NOFILE)[1]):
        log.warning(warning)
    try:
        return asyncio.run(Supervisor(args, catalog, count, caddy, folder).run())
    except Exception as exc:
        log.error("The app stopped: %s", first_line(exc))
        raise
