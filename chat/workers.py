"""Several UI processes on one engine core, behind one port: `python app.py --ui-workers N`.

Gradio runs every event of a process on one event loop, and at a few hundred simultaneous readers
that loop, not the engine, sets the pace (README, "Front-end capacity"). vLLM's own server scales out
the same way (`vllm serve --api-server-count`): the engine core starts once, and each front-end
process holds an `AsyncLLM` client of it, with its own client index. Here the supervisor starts the
core and N UI workers (chat/server.py, each on a private port), and routes the public port:

    browsers ─> Router (public port; sticky by cookie, chat/router.py) ─> UI worker i (Gradio, AsyncLLM client) ─┐
                                                                      ─> UI worker j ...                       ─┴─> engine core

vLLM's core greets each client slot once, when it starts: a new client on a slot whose client died
waits for that greeting forever. So the core is started with spare slots, and a worker that dies is
replaced on a fresh one while the others keep serving; when the spares run out the app serves on the
workers left and says so. If the engine core itself dies, the supervisor starts it and its workers
anew (the router answers "reload in a moment" meanwhile). Only the default preset's engine is served:
presets that need another engine are listed as unavailable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import multiprocessing
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

from chat import logs
from chat.engine import EngineSlot
from chat.errors import PresetError, first_line
from chat.presets import Preset, PresetCatalog
from chat.router import MAX_HEAD_BYTES, Backend, Router

log = logging.getLogger("chat.workers")

SPARE_SLOTS = 4  # workers that can be replaced over the engine's life
CHECK_EVERY_S = 0.5
STOP_WAIT_S = 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SharedEngine:
    """One vLLM engine core for `preset`, started by this process, with `slots` client slots.

    vLLM 0.32 binds each slot's sockets here and hands them to the client that adopts them (the
    same calls as `vllm serve --api-server-count`); vLLM 0.25 (the GPU host's) lets each client bind
    its slot's address itself, so the addresses are fixed here first."""

    def __init__(self, preset: Preset, slots: int) -> None:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine import utils as engine_utils
        from vllm.v1.executor import Executor

        from chat.engine import engine_arguments
        from chat.models import resolve_model

        folder = resolve_model(preset, report=lambda line: log.info("%s: %s", preset.name, line))
        args = AsyncEngineArgs(model=str(folder), **engine_arguments(preset, folder))
        args._api_process_count, args._api_process_rank = slots, -1
        config = args.create_engine_config()
        executor = Executor.get_class(config)
        self.slots = slots
        self.free = list(range(slots))
        self.listeners: Any = None
        if hasattr(engine_utils, "bind_engine_zmq_listeners"):
            self.listeners = engine_utils.bind_engine_zmq_listeners(config, slots)
            self._launch = engine_utils.launch_core_engines(config, executor, True, self.listeners.addresses)
            launch = self._launch.__enter__()
            self.manager, self.coordinator, self.addresses = launch.engine_manager, launch.coordinator, launch.addresses
        else:
            addresses = engine_utils.get_engine_zmq_addresses(config, slots, defer_api_server_ports=False)
            self._launch = engine_utils.launch_core_engines(config, executor, True, addresses, slots)
            self.manager, self.coordinator, self.addresses, _ = self._launch.__enter__()

    def wait_ready(self) -> None:
        """Blocking: return once the engine core has loaded the model (vLLM's start-up barrier)."""
        self._launch.__exit__(None, None, None)

    def take_slot(self) -> EngineSlot | None:
        if not self.free:
            return None
        index = self.free.pop(0)
        addresses: dict[str, Any] = {"input_address": self.addresses.inputs[index],
                                     "output_address": self.addresses.outputs[index]}
        if self.listeners is not None:
            input_listener, output_listener = self.listeners.inputs[index], self.listeners.outputs[index]
            addresses |= {"input_address": input_listener.address, "output_address": output_listener.address,
                          "input_listener": input_listener.socket, "output_listener": output_listener.socket}
        if self.coordinator is not None:
            addresses["stats_update_address"] = self.coordinator.get_stats_publish_address()
        return EngineSlot(addresses=addresses, count=self.slots, index=index)

    def handed_over(self, slot: EngineSlot) -> None:
        """The worker holds its own copy of the slot's sockets now."""
        if self.listeners is not None:
            self.listeners.inputs[slot.index].close()
            self.listeners.outputs[slot.index].close()

    @property
    def alive(self) -> bool:
        return self.manager is None or all(p.is_alive() for p in getattr(self.manager, "processes", []))

    def shutdown(self) -> None:
        if self.manager is not None:
            self.manager.shutdown()
        if self.coordinator is not None:
            self.coordinator.shutdown()
        if self.listeners is not None:
            for listener in (*self.listeners.inputs, *self.listeners.outputs):
                listener.cleanup()


def run_worker(args: argparse.Namespace, index: int, slot: EngineSlot) -> None:
    """A UI worker's process: chat/server.py on the private port in `args`."""
    from chat.presets import load_presets
    from chat.server import Worker, serve

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches every process; the supervisor stops us
    logs.configure(verbose=args.verbose)
    catalog = load_presets(args.presets_dir).sharing_engine_with(args.preset)
    sys.exit(serve(args, catalog, Worker(index, slot)))


@dataclass
class Supervisor:
    args: argparse.Namespace
    preset: Preset
    count: int
    backends: list[Backend] = field(default_factory=list)
    processes: dict[int, BaseProcess] = field(default_factory=dict)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.backends = [Backend(i) for i in range(self.count)]
        self.spawn_context = multiprocessing.get_context("spawn")

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.stopping.set)
        router = Router(lambda: self.backends)
        try:
            server = await asyncio.start_server(router.handle, self.args.host, self.args.port, limit=MAX_HEAD_BYTES)
        except OSError as exc:
            print(f"Cannot listen on {self.args.host}:{self.args.port} ({exc.strerror}); pick another --port.",
                  file=sys.stderr)
            return 2
        url = f"http://{'127.0.0.1' if self.args.host in ('0.0.0.0', '::') else self.args.host}:{self.args.port}/"
        print(f"Starting {self.count} UI workers on one engine for {self.preset.name}; the page will be at {url}",
              flush=True)
        try:
            while not self.stopping.is_set():
                if not await self.serve_one_engine(router, url):
                    return 1
        finally:
            server.close()
        return 0

    async def serve_one_engine(self, router: Router, url: str) -> bool:
        """Start the engine core and the workers, keep them serving until asked to stop or the core
        dies; False when the engine cannot start at all."""
        try:
            engine = await asyncio.to_thread(SharedEngine, self.preset, self.count + SPARE_SLOTS)
        except Exception as exc:
            log.error("The engine for %r could not start: %s", self.preset.name, first_line(exc))
            return False
        try:
            for backend in self.backends:
                self.start_worker(engine, backend)
            try:
                await asyncio.to_thread(engine.wait_ready)
            except Exception as exc:
                log.error("The engine for %r could not start: %s", self.preset.name, first_line(exc))
                return False
            announced = False
            while not self.stopping.is_set():
                if not engine.alive:
                    log.error("The engine for %r stopped; starting it and its UI workers again", self.preset.name)
                    break
                await self.look_after_workers(engine)
                if not announced and any(b.state == "serving" for b in self.backends):
                    status, _ = await router.health_report()
                    if status == 200:
                        print(logs.ready_line(self.preset.name, url), flush=True)
                        announced = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), timeout=CHECK_EVERY_S)
            return True
        finally:
            started = time.monotonic()
            await asyncio.to_thread(self.stop_workers)
            log.info("UI workers stopped in %.1f s", time.monotonic() - started)
            await asyncio.to_thread(engine.shutdown)
            log.info("Engine stopped in %.1f s", time.monotonic() - started)

    def start_worker(self, engine: SharedEngine, backend: Backend) -> None:
        slot = engine.take_slot()
        if slot is None:
            backend.state, backend.port, backend.pid = "stopped", None, None
            log.error("UI worker %d cannot be replaced: the engine has no spare connection left. "
                      "The other workers keep serving; restart the app to get it back.", backend.index)
            return
        worker_args = argparse.Namespace(**{**vars(self.args), "host": "127.0.0.1", "port": free_port(),
                                            "share": False})
        process = self.spawn_context.Process(target=run_worker, args=(worker_args, backend.index, slot),
                                             name=f"UIWorker-{backend.index}")
        process.start()
        engine.handed_over(slot)
        self.processes[backend.index] = process
        backend.port, backend.pid, backend.state = worker_args.port, process.pid, "starting"

    async def look_after_workers(self, engine: SharedEngine) -> None:
        for backend in self.backends:
            process = self.processes.get(backend.index)
            if process is None:
                continue
            if not process.is_alive():
                del self.processes[backend.index]
                log.error("UI worker %d stopped (exit code %s); starting another", backend.index, process.exitcode)
                backend.state, backend.port = "restarting", None
                self.start_worker(engine, backend)
            elif backend.state == "starting" and backend.port is not None and await _listening(backend.port):
                backend.state = "serving"
                log.info("UI worker %d serving (process %s)", backend.index, backend.pid)

    def stop_workers(self) -> None:
        for backend in self.backends:
            backend.state, backend.port = "stopped", None
        for process in self.processes.values():
            process.terminate()
        deadline = time.monotonic() + STOP_WAIT_S
        for process in self.processes.values():
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
        self.processes.clear()


async def _listening(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    return True


def supervise(args: argparse.Namespace, catalog: PresetCatalog, count: int) -> int:
    """Serve the default preset with `count` UI workers on one engine; the exit status."""
    from chat.server import end_children

    try:
        preset = catalog.get(args.preset)
    except PresetError as exc:
        print(f"{exc.message} Pick another with --preset; --list-presets shows them.", file=sys.stderr)
        return 2
    for problem in catalog.sharing_engine_with(preset.name).problems.values():
        log.warning("Preset unavailable: %s", problem)
    try:
        return asyncio.run(Supervisor(args, preset, count).run())
    finally:
        end_children()
