"""Several UI processes on the app's engines, behind one port: `python app.py --ui-workers N`.

Gradio runs every event of a process on one event loop, and at a few hundred simultaneous readers
that loop, not the engine, sets the pace (docs/benchmarks.md, "Front-end capacity"). vLLM's own server scales
out the same way (`vllm serve --api-server-count`): each engine core starts once and every front-end
process holds a client of it. The supervisor runs three things:

    browsers ─> Caddy on the public port (chat/front_door.py) ─> UI worker i (Gradio; a client of each core it uses) ─┐
                                                               ─> UI worker j ...                                   ─┴─> engine cores
                                   the engine owner (chat/owner.py): starts, wakes, puts to sleep, unloads, restarts every core

- The engine owner decides every engine's life for all workers (chat/owner.py); a worker asks it.
- N UI workers (chat/server.py), each on a private port that stays the same for its replacements.
- The front door, Caddy, started again if it stops.

A worker that dies is replaced on its port while the others keep serving; the front door sends its
visitors elsewhere meanwhile (their pages then start a new session). Every process writes its
metrics to one folder (prometheus_client's multiprocess mode), so `/metrics` from any worker is the
whole app's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import multiprocessing
import os
import resource
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING

from chat import control, logs
from chat.errors import PresetError, first_line
from chat.front_door import MISSING, FrontDoor, caddy_binary
from chat.presets import PresetCatalog

if TYPE_CHECKING:
    from chat.owner import EngineOwner

log = logging.getLogger("chat.supervisor")

CHECK_EVERY_S = 0.5
STOP_WAIT_S = 15.0
FRONT_DOOR_START_S = 10.0


def private_port() -> socket.socket:
    """A socket bound to a free loopback port, not listening: a worker listens on it, and it stays
    bound in the supervisor for as long as the app runs. Bound without SO_REUSEADDR, it keeps every
    other program off the port, also while no worker listens, so the front door can only ever reach
    this app's workers there."""
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


def stop_listening(bound: socket.socket) -> None:
    """A dead worker's port refuses connections (so the front door tries another worker at once)
    but stays bound here until the replacement listens on it again. The worker listened with
    SO_REUSEADDR (chat/ui/gradio_internals.py, serve_on); without it again, the bound socket keeps
    every other program off the port in the meantime."""
    with contextlib.suppress(OSError):  # not listening
        bound.shutdown(socket.SHUT_RD)
    bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)


def port_is_free(host: str, port: int) -> str | None:
    """None when `host:port` can be listened on; otherwise why not, in words."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


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
    process: BaseProcess | None = None
    # starting, serving (listening, and its first engine start has ended: /healthz waits for every
    # worker's first), restarting, stopped
    state: str = "starting"

    def __post_init__(self) -> None:
        # Read once: a socket that has stopped listening reports port 0 until it listens again.
        self.port = int(self.bound.getsockname()[1])


class Supervisor:
    def __init__(self, args: argparse.Namespace, catalog: PresetCatalog, count: int, caddy: Path,
                 folder: Path) -> None:
        self.args, self.catalog, self.caddy, self.folder = args, catalog, caddy, folder
        self.workers = [WorkerProcess(i, private_port()) for i in range(count)]
        self.stopping = asyncio.Event()
        self.look_now = asyncio.Event()  # set when a worker's process ends, so its port refuses at once
        self.spawn = multiprocessing.get_context("spawn")
        self.front = FrontDoor(args.host, args.port, [w.port for w in self.workers], folder)

    async def run(self) -> int:
        from chat.owner import EngineOwner
        from chat.server import end_starting_engines, memory_budget

        loop = asyncio.get_running_loop()

        def stop() -> None:
            if not self.stopping.is_set():
                print(logs.STOPPING, flush=True)
            self.stopping.set()
            self.look_now.set()

        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop)
        problem = port_is_free(self.args.host, self.args.port)
        if problem is not None:
            print(f"Cannot listen on {self.args.host}:{self.args.port} ({problem}); pick another --port.", file=sys.stderr)
            return 2
        default = self.catalog.get(self.args.preset)
        owner = EngineOwner(self.catalog, self.folder, len(self.workers), memory_budget(self.args), self.args.max_waiting)
        owner.worker_states = lambda: [{"index": w.index, "state": w.state} for w in self.workers]
        serving = loop.create_task(owner.serve(), name="engine owner")
        first = owner.start(default)
        url = f"http://{'127.0.0.1' if self.args.host in ('0.0.0.0', '::') else self.args.host}:{self.args.port}/"
        print(f"Starting {len(self.workers)} UI workers; the page will be at {url}", flush=True)
        try:
            if not await self.open_front_door():
                return 2
            for worker in self.workers:
                self.start_worker(worker)
            announced = False
            while not self.stopping.is_set():
                await self.look_after(owner)
                if not announced and first.ready_at is not None and all(w.state == "serving" for w in self.workers):
                    print(logs.ready_line(default.name, url), flush=True)
                    announced = True
                # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancel that comes as
                # its wait ends (chat/stream.py `paced`).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(CHECK_EVERY_S):
                        await self.look_now.wait()
                self.look_now.clear()
            return 0
        finally:
            owner.closing = True  # no engine start begins while the workers stop
            started = time.monotonic()
            self.front.stop()
            await asyncio.to_thread(self.stop_workers)
            await owner.close_all()
            end_starting_engines(owner)  # cut short: the exit would wait for each whole start
            serving.cancel()
            if self.stopping.is_set():
                print(logs.stopped_line(time.monotonic() - started), flush=True)

    async def open_front_door(self) -> bool:
        self.front.start(self.caddy)
        deadline = time.monotonic() + FRONT_DOOR_START_S
        while time.monotonic() < deadline:
            if not self.front.alive:
                code = self.front.process.returncode if self.front.process else None
                print(f"The front door (Caddy) could not start on {self.args.host}:{self.args.port} (exit code {code}; "
                      "its message is above); pick another --port, or start with --ui-workers 1.", file=sys.stderr)
                return False
            if await _listening(self.args.host if self.args.host not in ("0.0.0.0", "::") else "127.0.0.1", self.args.port):
                return True
            await asyncio.sleep(0.1)
        return self.front.alive

    def start_worker(self, worker: WorkerProcess) -> None:
        worker_args = argparse.Namespace(**{**vars(self.args), "host": "127.0.0.1", "port": worker.port, "share": False})
        # The socket travels to the spawned process as a duplicated descriptor (multiprocessing's reduction).
        process = self.spawn.Process(target=run_worker, args=(worker_args, worker.index, self.folder, worker.bound),
                                     name=f"UIWorker-{worker.index}")
        process.start()
        worker.process = process
        loop, ended = asyncio.get_running_loop(), process.sentinel

        def on_end() -> None:
            loop.remove_reader(ended)
            self.look_now.set()

        loop.add_reader(ended, on_end)

    async def look_after(self, owner: EngineOwner) -> None:
        from chat import metrics

        if not self.front.alive:
            log.error("The front door (Caddy) stopped (exit code %s); starting it again",
                      self.front.process.returncode if self.front.process else None)
            await self.open_front_door()
        for worker in self.workers:
            process = worker.process
            if process is None:
                continue
            if not process.is_alive():
                _metrics_of_dead_process(process.pid)
                stop_listening(worker.bound)
                log.error("UI worker %d stopped (exit code %s); starting another", worker.index, process.exitcode)
                worker.state = "restarting"
                metrics.UI_WORKER_UP.labels(str(worker.index)).set(0)
                self.start_worker(worker)
            elif worker.state != "serving" and owner.settled(worker.index) and await _listening("127.0.0.1", worker.port):
                worker.state = "serving"
                metrics.UI_WORKER_UP.labels(str(worker.index)).set(1)
                log.info("UI worker %d serving (process %s)", worker.index, process.pid)

    def stop_workers(self) -> None:
        processes = [w.process for w in self.workers if w.process is not None]
        for worker in self.workers:
            worker.state = "stopped"
        for process in processes:
            process.terminate()
        deadline = time.monotonic() + STOP_WAIT_S
        for process in processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()


async def _listening(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False
    writer.close()
    return True


def _metrics_of_dead_process(pid: int | None) -> None:
    """Its gauges no longer count in the whole app's sums (prometheus_client's multiprocess mode)."""
    from prometheus_client import multiprocess

    if pid is not None:
        multiprocess.mark_process_dead(pid)


def _more_open_files() -> None:
    """Every process may hold as many connections as the machine lets it (a visitor's page holds two)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def supervise(args: argparse.Namespace, catalog: PresetCatalog, count: int) -> int:
    """Serve every preset with `count` UI workers behind Caddy; the exit status."""
    from chat.engine_vllm import UntestedVllm, check_version
    from chat.server import end_children

    caddy = caddy_binary()
    if caddy is None:
        print(MISSING, file=sys.stderr)
        return 2
    try:
        check_version(args.allow_untested_vllm)  # here once: the UI workers do not check again
    except UntestedVllm as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        catalog.get(args.preset)
    except PresetError as exc:
        print(f"{exc.message} Pick another with --preset; --list-presets shows them.", file=sys.stderr)
        return 2
    for problem in catalog.problems.values():
        log.warning("Preset unavailable: %s", problem)
    if args.share:
        log.warning("--share makes no public link with several UI workers (Gradio's link reaches one process); "
                    "publish the front door's port yourself, or use --ui-workers 1.")
    folder = control.private_folder()
    # Before anything imports prometheus_client, in this process and the ones it starts.
    metrics_dir = folder / "metrics"
    metrics_dir.mkdir()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    _more_open_files()
    try:
        return asyncio.run(Supervisor(args, catalog, count, caddy, folder).run())
    except Exception as exc:
        log.error("The app stopped: %s", first_line(exc))
        raise
    finally:
        end_children()
        shutil.rmtree(folder, ignore_errors=True)
