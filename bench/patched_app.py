"""app.py, unchanged, except for the number of Gradio queue slots (a benchmark experiment).

Gradio's queue runs at most `max_threads` events at once (Gradio's default 40, app.py's
QUEUE_SLOTS), whatever the events' concurrency limits: with more simultaneous readers than that,
the rest wait in Gradio's queue before the app even sees them. This launcher runs app.main() with
`demo.launch(max_threads=N)` to measure another number without editing the app:

    BENCH_GRADIO_MAX_THREADS=40 python bench/patched_app.py --port 7861 ...   # app.py's flags

With BENCH_CPROFILE=FILE it also runs the server's thread (the event loop that runs every handler)
under cProfile and writes the stats to FILE when the app exits.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":  # the CPU engine spawns processes that re-import this file
    import gradio

    slots = int(os.environ.get("BENCH_GRADIO_MAX_THREADS", "1024"))
    original = gradio.Blocks.launch

    def launch(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        kwargs["max_threads"] = slots  # app.py passes its own
        return original(self, *args, **kwargs)

    gradio.Blocks.launch = launch
    sys.path.insert(0, str(ROOT))
    sys.argv = [str(ROOT / "app.py"), *sys.argv[1:]]
    import app

    profile_to = os.environ.get("BENCH_CPROFILE")
    if not profile_to:
        sys.exit(app.main())
    import cProfile

    import uvicorn

    profiler = cProfile.Profile()
    serve = uvicorn.Server.run

    def run(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        profiler.enable()  # in the server's thread: the event loop that runs every handler
        try:
            return serve(self, *args, **kwargs)
        finally:
            profiler.disable()

    uvicorn.Server.run = run
    try:
        code = app.main()
    finally:
        profiler.dump_stats(profile_to)
    sys.exit(code)
