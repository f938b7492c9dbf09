"""Entry point: parse flags, build the chat UI on shared vLLM engines, and serve it.

    python app.py                     # the embedded CPU default on http://127.0.0.1:7860
    python app.py --help              # every flag, with its environment variable
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chat.presets import PresetCatalog

log = logging.getLogger("chat")


def print_presets(catalog: PresetCatalog) -> None:
    for name, preset in catalog.presets.items():
        stem = preset.path.stem if preset.path else ""
        print(f"{name}  [{stem}]  {preset.hardware.device}  {preset.model}\n    {preset.description}")
    for problem in catalog.problems.values():
        print(f"UNAVAILABLE  {problem}")


def main(argv: Sequence[str] | None = None) -> int:
    # Imported here, not above: a process spawned for the app imports this module first (below),
    # and should leave the app's process group before it spends seconds importing.
    from chat import lifeline, logs, settings
    from chat.presets import load_presets

    args = settings.parse(argv)
    logs.configure(verbose=args.verbose)  # before anything imports vLLM (loading presets does)
    lifeline.forked_processes_leave_the_group()
    if args.list_presets:  # at once: vLLM's check of the engine settings is --check-presets's
        print_presets(load_presets(args.presets_dir, check_engine=False))
        return 0
    if args.check_presets:
        catalog = load_presets(args.presets_dir)
        for problem in catalog.problems.values():
            print(problem)
        print(f"{len(catalog.presets)} valid, {len(catalog.problems)} invalid preset file(s).")
        return 1 if catalog.problems else 0

    from chat.engine_core import on_cpu
    from chat.front_door import MISSING, caddy_binary
    from chat.shedding import use_descriptor_limit

    workers = settings.ui_workers(args, has_gpu=not on_cpu())
    caddy = caddy_binary() if workers > 1 else None
    if workers > 1 and caddy is None:  # said before the presets' check spends seconds importing vLLM
        print(MISSING, file=sys.stderr)
        return 2
    catalog = load_presets(args.presets_dir)
    use_descriptor_limit()  # before anything starts: the workers, Caddy and the engines inherit it
    if caddy is not None:
        from chat.supervisor import supervise

        return supervise(args, catalog, workers, caddy)
    from chat.server import serve

    return serve(args, catalog)


def run() -> None:
    """`python app.py`: the app, then the process's end (tests/stand_in.py runs it too)."""
    from chat.lifeline import exit_without_teardown

    try:
        status = main()
    except KeyboardInterrupt:  # Ctrl-C before the app served: it had started nothing to stop in order
        status = 130
    exit_without_teardown(status)


def spawned() -> None:
    """What a process multiprocessing starts for the app does first: a UI worker (forked from the
    worker server, chat/supervisor.py), an engine core or its worker (tests/stand_in.py's too)."""
    from chat import lifeline

    lifeline.leave_terminal_group()  # the app's main process stops it (chat/lifeline.py)
    lifeline.end_with_parent()
    lifeline.forked_processes_leave_the_group()  # what it forks in turn (vLLM, on a GPU)
    lifeline.spawned_processes_end_without_teardown()

    from chat import logs

    logs.configure_spawned()


if __name__ == "__main__":
    run()
elif __name__ == "__mp_main__":  # a process spawned for the app
    spawned()
