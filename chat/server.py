"""One serving process: the chat UI, its routes and its engines, on one port.

`python app.py` runs one of these on the public port. With `--ui-workers N` the supervisor
(chat/supervisor.py) runs N of them on private ports behind Caddy, each a client of the engine
cores that the supervisor's engine owner runs (`Worker`).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import logging
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chat import heap, logs
from chat.presets import PresetCatalog

if TYPE_CHECKING:
    from chat.auth import Login
    from chat.capacity_run import CapacityLab
    from chat.live import ReplyStore
    from chat.monitor import Monitor
    from chat.owner_link import OwnerLink
    from chat.presets import Preset
    from chat.registry import EngineRegistry
    from chat.service import ChatService
    from chat.votes import VoteStore

log = logging.getLogger("chat")
QUEUE_SLOTS = 1024
MAX_UPLOAD = "1mb"  # the page takes no uploads; Gradio's /upload would otherwise store a file of any size
CLOSE_WAIT_S = 30.0
STOPPING_WITHIN_S = 1.0  # how long a process frozen by the stop may take to stop (it may wait on the disk)
END_STARTS_WITHIN_S = 60.0  # a start gives up within a second of its processes' end; this is a backstop
STOP_SEEN_WITHIN_S = 0.5  # how soon a stop whose KeyboardInterrupt was lost is seen (`Shutdown.wait`)


@dataclass(frozen=True)
class Worker:
    """This process is UI worker `index` of a supervisor: it serves on `listener`, a private port the
    supervisor opened and keeps for its replacements, and asks the engine owner, whose socket is in
    `folder`, for every engine (chat/owner_link.py)."""

    index: int
    folder: Path
    listener: socket.socket


def memory_budget(args: argparse.Namespace) -> float:
    """--memory-budget-gb in the registry's unit: bytes of RAM on a CPU, a share of the GPU's memory."""
    from chat.engine_core import on_cpu

    budget = float(args.memory_budget_gb)
    if on_cpu():
        import psutil

        return (budget * 1e9) if budget else psutil.virtual_memory().total / 2
    return budget or 1.0


class Shutdown:
    """SIGTERM or Ctrl-C: close the engines on the server's loop first, then close the server.

    Closing the server first, vLLM's output handler was cancelled with Gradio's loop and logged an
    engine death with a traceback. Closed first, the engines end their readers' streams with a
    sentence instead (`close_all` aborts them before it shuts each engine down). The app's own
    process says so in two lines; a UI worker says nothing (its supervisor does)."""

    def __init__(self, registry: EngineRegistry, announce: bool) -> None:
        self.registry = registry
        self.announce = announce
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's, once it runs
        self.started: float | None = None  # when the stop came

    def install(self, ctrl_c: bool) -> None:
        signal.signal(signal.SIGTERM, self.interrupt)
        if ctrl_c:
            signal.signal(signal.SIGINT, self.interrupt)
        sys.unraisablehook = self.unraisable

    def interrupt(self, signum: int, frame: object) -> None:
        self.started = time.monotonic()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second one would break the shutdown
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C still quits at once
        if self.announce:
            print(logs.STOPPING, flush=True)
        self.registry.closing = True  # an engine start asked for from now on does not begin
        if self.loop is not None and self.loop.is_running():
            closing = asyncio.run_coroutine_threadsafe(self.registry.close_all(), self.loop)
            with contextlib.suppress(Exception):
                closing.result(timeout=CLOSE_WAIT_S)
        end_starting_engines(self.registry)
        raise KeyboardInterrupt  # `serve` closes the server on it (or `wait` sees the stop: `unraisable`)

    def wait(self) -> None:
        """Until the stop. Its KeyboardInterrupt ends the wait at once; where it was lost, `started` does."""
        while self.started is None:
            time.sleep(STOP_SEEN_WITHIN_S)

    def unraisable(self, unraisable: Any) -> None:
        """A signal lands wherever the main thread is, also in a finalizer that the garbage collector
        runs (`__del__`), where Python prints the KeyboardInterrupt with a traceback and drops it: a UI
        worker stopped while it started went on starting, until its supervisor killed it 15 s later
        (`tests/test_robustness.py`, once). That one is dropped quietly: `wait` sees the stop."""
        if not (isinstance(unraisable.exc_value, KeyboardInterrupt) and self.started is not None):
            sys.__unraisablehook__(unraisable)

    def done(self) -> None:
        if self.announce and self.started is not None:
            print(logs.stopped_line(time.monotonic() - self.started), flush=True)


def end_starting_engines(registry: EngineRegistry) -> None:
    """After `close_all`: what is left are engines still starting (in a thread, which cannot be
    cancelled); their processes are ended as they appear, until every start has given up (one may
    not have started vLLM's processes yet when the stop comes). Left to the exit, the exit first
    waited for each whole start, and a stop that would not wait that long (a supervisor's, docker's,
    a test's) killed the app and left the engine running without it, holding its memory. Killed, not
    asked: a start has nothing to save, and a process of a start that sees another end logs it as an
    error: so all are frozen first, then killed. Only vLLM's processes (named VLLM::…, and what they
    started, named or not yet): this process's resource tracker must live on to clean up after them.
    A UI worker's registry starts no vLLM process of its own: nothing to wait for there. Called once
    `registry.closing` is set (by the stop, or by `close_all`), so that no new start begins."""
    import psutil

    from chat.engine_vllm import is_vllm_process

    deadline = time.monotonic() + END_STARTS_WITHIN_S
    told = False
    while registry.building and time.monotonic() < deadline:
        doomed: list[psutil.Process] = []
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if is_vllm_process(child.name()) and child not in doomed:
                    freeze(child, doomed)
        if doomed and not told:
            names = ", ".join(repr(engine.preset.name) for engine in list(registry.building.values()))
            log.info("Stopping the engine for %s while it starts", names)
            told = True
        for process in doomed:
            with contextlib.suppress(psutil.Error):
                process.kill()
        time.sleep(0.1)


def freeze(process: Any, frozen: list[Any]) -> None:
    """Stop `process` and everything it started, each before it can start another or see one end.
    Its children are listed once it has stopped: a process it was spawning at that moment is among
    them (listed before, that one was missed, and once its parent was killed it printed an EOFError
    with a traceback into the app's log, finding no preparation data to read)."""
    import psutil

    process.suspend()
    frozen.append(process)
    deadline = time.monotonic() + STOPPING_WITHIN_S
    # SIGSTOP takes effect when the process next runs: within milliseconds, unless it waits on the disk.
    with contextlib.suppress(psutil.Error):
        while process.status() not in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD) \
                and time.monotonic() < deadline:
            time.sleep(0.002)
    for child in process.children():
        with contextlib.suppress(psutil.Error):
            if child not in frozen:
                freeze(child, frozen)


def end_children() -> None:
    """Last resort at exit: no engine process may outlive the app (each holds GBs of memory).
    Python's resource tracker is left alone: it ends by itself once the app has, after removing what
    the engines' processes left in shared memory; and it ignores SIGTERM, so asking it cost every
    stop 5 s."""
    import psutil

    children = [child for child in psutil.Process().children(recursive=True) if not _resource_tracker(child)]
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=5)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()


def _resource_tracker(process: Any) -> bool:
    import psutil

    try:
        return "multiprocessing.resource_tracker" in " ".join(process.cmdline())
    except psutil.Error:  # gone already
        return False


def serve(args: argparse.Namespace, catalog: PresetCatalog, worker: Worker | None = None) -> int:
    """Build the UI on this process's engines and serve it until interrupted; the exit status."""
    if worker is None:
        for problem in catalog.problems.values():
            log.warning("Preset unavailable: %s", problem)
    try:
        app = assemble(args, catalog, worker)
    except Refused as exc:
        print(exc, file=sys.stderr)
        return 2
    shutdown = Shutdown(app.registry, announce=worker is None)
    try:
        launch(app, args, worker, shutdown)
        shutdown.wait()  # `Shutdown` raises KeyboardInterrupt here once the engines are closed
    except KeyboardInterrupt:  # the stop, or a second Ctrl-C (which does not wait for the engines)
        pass
    app.demo.close(verbose=False)  # the server thread, the queue, the pages' heartbeats
    shutdown.done()
    return 0


class Refused(Exception):
    """The flags cannot make an app; the message says why and what to pass instead."""


@dataclass
class App:
    """What one process serves: its engines (or its link to the owner's), the service on them, the page."""

    service: ChatService
    registry: EngineRegistry
    default: Preset
    store: VoteStore
    logs: ReplyStore  # the replies sockets follow: the API's and the pages'
    login: Login | None
    link: OwnerLink | None
    lab: CapacityLab | None
    monitor: Monitor
    demo: Any


def assemble(args: argparse.Namespace, catalog: PresetCatalog, worker: Worker | None) -> App:
    """The engines' registry, the reply service and the page, from the flags; Refused with a sentence."""
    # Heavy imports (vLLM, Gradio) only once we know we will serve.
    from chat.admin import Admins
    from chat.auth import Login
    from chat.capacity_run import CapacityLab
    from chat.engine_core import on_cpu
    from chat.engine_vllm import UntestedVllm, check_version
    from chat.errors import ChatError, PresetError
    from chat.live import ReplyStore
    from chat.monitor import Monitor
    from chat.owner_link import OwnerLink
    from chat.pacing import RedrawPacer
    from chat.registry import EngineRegistry
    from chat.service import Admission, ChatService
    from chat.tallies import InProcess
    from chat.ui import build_ui
    from chat.ui.gradio_internals import UntestedGradio, login_token
    from chat.votes import VoteStore

    if worker is None:  # a UI worker's supervisor checked it
        try:
            check_version(args.allow_untested_vllm)
        except UntestedVllm as exc:
            raise Refused(str(exc)) from exc
    # A UI worker's line to the engine owner, which also keeps the app's counts (chat/tallies.py).
    link = OwnerLink(worker.folder, worker.index) if worker is not None else None
    tallies = link or InProcess()
    try:
        login = Login.parse(args.auth, signed_in_on_page=lambda connection: login_token(connection) is not None,
                            tallies=tallies)
        admins = Admins.parse(args.admins, local=args.admin_local, login=login)
    except ValueError as exc:
        raise Refused(str(exc)) from exc
    try:
        store = VoteStore(args.votes_db)
    except ChatError as exc:
        raise Refused(exc.message) from exc
    try:
        default = catalog.get(args.preset)
        registry = (EngineRegistry(max_waiting=args.max_waiting, sharing=link) if link is not None else
                    EngineRegistry(memory_budget=memory_budget(args), max_waiting=args.max_waiting))
        pacer = RedrawPacer(floor_s=max(args.flush_ms, 0) / 1000)
        admission = Admission(args.concurrency_limit, args.max_waiting, tallies) if args.concurrency_limit > 0 else None
        service = ChatService(catalog, registry, default.name, has_gpu=not on_cpu(), pacer=pacer, admission=admission,
                              per_visitor=max(args.replies_per_visitor, 0), tallies=tallies)
        service.preset(None)
    except PresetError as exc:
        raise Refused(f"{exc.message} Pick another with --preset; --list-presets shows them.") from exc
    monitor = Monitor(registry)
    reply_logs = ReplyStore()  # one for the tabs and /chat: a page's socket follows what its tabs write
    lab = CapacityLab(service, lease=link) if admins.anyone_can_be else None
    try:
        demo = build_ui(service, monitor, reply_logs, store=store, admins=admins, lab=lab)
    except UntestedGradio as exc:
        raise Refused(str(exc)) from exc
    return App(service, registry, default, store, reply_logs, login, link, lab, monitor, demo)


def launch(app: App, args: argparse.Namespace, worker: Worker | None, shutdown: Shutdown) -> None:
    """Serve the page, the routes beside it and the engines' background work (in Gradio's thread),
    with `shutdown` ready to stop them; returns once it serves."""
    from starlette.middleware import Middleware
    from starlette.middleware.gzip import GZipMiddleware

    from chat import metrics
    from chat.auth import LoginLimit
    from chat.registry import wait_ready
    from chat.ui import CSS, HEAD, live_script
    from chat.ui.gradio_internals import (
        PLAIN_REQUEST_ERRORS,
        PlainGradioErrors,
        serve_on,
        sessions_of_open_pages,
        warm_event_path,
    )
    from chat.ui.page_shell import STATUS_TIMERS, PageShell, shell_of
    from chat.ui.style import THEME
    from chat.voters import VoterCookie
    from chat.web import routes

    registry = app.registry

    @contextlib.asynccontextmanager
    async def lifespan(_: object) -> AsyncIterator[None]:
        loop = shutdown.loop = asyncio.get_running_loop()
        background = []
        if app.link is not None:
            await app.link.open(registry)
        first = registry.start(app.default)  # in the background; the page is usable while it loads
        if app.link is None:  # alone: no stream notices an idle engine's death (a worker's owner sees its cores end)
            background.append(loop.create_task(registry.watch()))
        background += [loop.create_task(app.monitor.run()),
                       loop.create_task(heap.freeze_when_ready(wait_ready(first))),  # no 0.5 s pauses while serving
                       # nor pauses that grow with every visitor served: a page gone for as long as a
                       # dropped socket's replies wait for it leaves nothing in Gradio
                       loop.create_task(sessions_of_open_pages(app.demo, keep_s=args.resume_grace_s))]
        if worker is None:  # a worker's address is private: the supervisor announces the public one
            background.append(loop.create_task(
                logs.say_when_ready(first, lambda: app.demo.local_url, lambda: app.demo.share_url)))
        yield
        for task in background:
            task.cancel()
        await registry.close_all()
        app.store.close()

    middleware = [Middleware(GZipMiddleware, minimum_size=1024), Middleware(VoterCookie, keys=app.store.keys),
                  Middleware(PlainGradioErrors)]
    if app.login is not None:
        middleware.append(Middleware(LoginLimit, failures=app.login.failures))
    # Behind a login the page is a login form, not the chat whose title the shell shows.
    middleware.append(Middleware(PageShell, shell=STATUS_TIMERS + ("" if app.login else shell_of(app.default))))
    shutdown.install(ctrl_c=worker is None)  # a worker ignores Ctrl-C: its supervisor stops it
    atexit.register(end_children)
    if worker is not None:
        serve_on(worker.listener)
    warm_event_path()  # before listening: a worker is not sent visitors until it listens
    extra_routes = [*routes(app.service, app.logs, app.login, grace_s=args.resume_grace_s, lab=app.lab), *metrics.routes(app.login),
                    *live_script.routes()]
    app.demo.launch(
        css=CSS,
        theme=THEME,
        head=HEAD,
        server_name=args.host,
        server_port=args.port,
        share=args.share,
        auth=app.login.accounts if app.login else None,
        show_error=False,
        max_file_size=MAX_UPLOAD,
        quiet=worker is not None,
        # Gradio's queue runs at most max_threads events at once (40 by default), whatever their
        # concurrency limits: beyond that, readers would wait in Gradio's queue, not in vLLM's batch.
        # Our handlers are async, so the slots cost no threads.
        max_threads=QUEUE_SLOTS,
        # Gradio compresses its scripts but not the page itself (its config: ~340 KB, ~30 KB gzipped).
        # Starlette's GZip leaves event streams (Gradio's queue) and WebSockets alone.
        app_kwargs={"middleware": middleware, "lifespan": lifespan, "routes": extra_routes,
                    "exception_handlers": PLAIN_REQUEST_ERRORS},
        prevent_thread_lock=True,  # `serve` waits for the stop itself: Gradio's wait prints a line of its own
    )
