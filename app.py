"""Entry point: parse flags, build the chat UI on shared vLLM engines, and serve it.

    python app.py                     # the embedded CPU default on http://127.0.0.1:7860
    python app.py --help              # every flag, with its environment variable
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import signal
import sys
from collections.abc import AsyncIterator, Sequence

from chat import logs, settings
from chat.presets import PresetCatalog, load_presets

log = logging.getLogger("chat")
QUEUE_SLOTS = 1024


def print_presets(catalog: PresetCatalog) -> None:
    for name, preset in catalog.presets.items():
        stem = preset.path.stem if preset.path else ""
        print(f"{name}  [{stem}]  {preset.hardware.device}  {preset.model}\n    {preset.description}")
    for problem in catalog.problems.values():
        print(f"UNAVAILABLE  {problem}")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # Gradio closes the server on it, which runs our shutdown


def _end_children() -> None:
    """Last resort at exit: no engine process may outlive the app (each holds GBs of memory)."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=5)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()


def main(argv: Sequence[str] | None = None) -> int:
    args = settings.parse(argv)
    logs.configure(verbose=args.verbose)  # before anything imports vLLM (loading presets does)
    catalog = load_presets(args.presets_dir)
    if args.list_presets:
        print_presets(catalog)
        return 0
    if args.check_presets:
        for problem in catalog.problems.values():
            print(problem)
        print(f"{len(catalog.presets)} valid, {len(catalog.problems)} invalid preset file(s).")
        return 1 if catalog.problems else 0

    for problem in catalog.problems.values():
        log.warning("Preset unavailable: %s", problem)
    # Heavy imports (vLLM, Gradio) only once we know we will serve.
    from starlette.middleware import Middleware
    from starlette.middleware.gzip import GZipMiddleware

    from chat import metrics
    from chat.admin import Admins
    from chat.auth import Login
    from chat.engine import on_cpu
    from chat.errors import ChatError, PresetError
    from chat.monitor import Monitor
    from chat.pacing import RedrawPacer
    from chat.registry import EngineRegistry
    from chat.service import ChatService
    from chat.ui import CSS, build_ui
    from chat.ui.gradio_internals import UntestedGradio
    from chat.ui.live import HEAD as LIVE_SCRIPT
    from chat.ui.style import HEAD, THEME
    from chat.votes import VoteStore
    from chat.web import routes

    budget = args.memory_budget_gb
    if on_cpu():
        import psutil

        budget = (budget * 1e9) if budget else psutil.virtual_memory().total / 2
    else:
        budget = budget or 1.0
    try:
        login = Login.parse(args.auth)
        admins = Admins.parse(args.admins, local=args.admin_local, login=login)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        store = VoteStore(args.votes_db)
    except ChatError as exc:
        print(exc.message, file=sys.stderr)
        return 2
    registry = EngineRegistry(memory_budget=budget, max_waiting=args.max_waiting)
    try:
        default = catalog.get(args.preset)
        pacer = RedrawPacer(floor_s=max(args.flush_ms, 0) / 1000)
        service = ChatService(catalog, registry, default.name, has_gpu=not on_cpu(), pacer=pacer)
        service.preset(None)
    except PresetError as exc:
        print(f"{exc.message} Pick another with --preset; --list-presets shows them.", file=sys.stderr)
        return 2
    monitor = Monitor(registry)
    try:
        demo = build_ui(service, monitor, concurrency_limit=args.concurrency_limit or None, store=store, admins=admins)
    except UntestedGradio as exc:
        print(exc, file=sys.stderr)
        return 2

    @contextlib.asynccontextmanager
    async def lifespan(app: object) -> AsyncIterator[None]:
        first = registry.start(default)  # in the background; the page is usable while it loads
        loop = asyncio.get_running_loop()
        background = [loop.create_task(registry.watch()), loop.create_task(monitor.run()),
                      loop.create_task(logs.say_when_ready(first, lambda: demo.local_url, lambda: demo.share_url))]
        yield
        for task in background:
            task.cancel()
        await registry.close_all()
        store.close()

    signal.signal(signal.SIGTERM, _interrupt)
    atexit.register(_end_children)
    demo.launch(
        css=CSS,
        theme=THEME,
        head=HEAD + LIVE_SCRIPT,
        server_name=args.host,
        server_port=args.port,
        share=args.share,
        auth=login.accounts if login else None,
        show_error=False,
        # Gradio's queue runs at most max_threads events at once (40 by default), whatever their
        # concurrency limits: beyond that, readers would wait in Gradio's queue, not in vLLM's batch.
        # Our handlers are async, so the slots cost no threads.
        max_threads=QUEUE_SLOTS,
        # Gradio compresses its scripts but not the page itself (its config: ~340 KB, ~30 KB gzipped).
        # Starlette's GZip leaves event streams (Gradio's queue) and WebSockets alone.
        app_kwargs={"middleware": [Middleware(GZipMiddleware, minimum_size=1024)], "lifespan": lifespan, "routes": [*routes(service, login, grace_s=args.resume_grace_s), *metrics.routes(login)]},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
