"""app.py from any checkout, with vLLM's engine core replaced by bench/token_source.py.

    BENCH_APP_ROOT=/tmp/baseline BENCH_STEP_MS=25 BENCH_SOURCE_LOG=source.jsonl BENCH_APP_CPUS=0 \\
        python bench/frontend_app.py --port 7861 --presets-dir bench/presets/frontend   # app.py's flags

Run by bench/frontend.py. The app's own code is untouched and imported from BENCH_APP_ROOT (default:
this checkout), so one benchmark can run two versions of the app side by side; only this checkout's
token source is used. BENCH_APP_CPUS pins the app's process to those cores before any thread starts,
so its threads inherit the pinning; BENCH_NICE sets its scheduling priority (negative: ahead of
other processes on a shared machine; needs the right to raise priority). BENCH_TIMELINE_LOG records
the app's moments of each page reply (bench/frontend_timeline.py) and BENCH_SOURCE_TAG tags the
source's records with what that pattern finds in each prompt (bench/frontend_rates.py sets both).
BENCH_GC_FREEZE=1 (an experiment) freezes the process's heap (`gc.freeze`) a few seconds after its
engine is built, as vLLM's own API server does after its start.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    cpus = os.environ.get("BENCH_APP_CPUS")
    if cpus:
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    sys.path.insert(0, str(ROOT))  # this checkout's bench package, whichever app runs
    if os.environ.get("BENCH_NICE"):  # a shared machine: keep others' work from taking the app's core
        from bench.procs_priority import prioritize

        prioritize(int(os.environ["BENCH_NICE"]))
    from bench.token_source import install

    log_path = os.environ.get("BENCH_SOURCE_LOG")
    sources = install(step_s=float(os.environ.get("BENCH_STEP_MS", "25")) / 1000, log_path=Path(log_path) if log_path else None,
            tag=os.environ.get("BENCH_SOURCE_TAG", ""))
    if os.environ.get("BENCH_TIMELINE_LOG"):
        from bench import frontend_timeline

        frontend_timeline.install(Path(os.environ["BENCH_TIMELINE_LOG"]))
    if os.environ.get("BENCH_GC_FREEZE") == "1":
        import gc
        import threading
        import time

        def freeze_when_built() -> None:
            while not sources:
                time.sleep(0.5)
            time.sleep(5.0)  # the engine's start and the page's first build done
            gc.collect()
            gc.freeze()
            print(f"bench: froze {gc.get_freeze_count()} objects", file=sys.stderr, flush=True)

        threading.Thread(target=freeze_when_built, daemon=True).start()
    app_root = Path(os.environ.get("BENCH_APP_ROOT") or ROOT).resolve()
    sys.path.insert(0, str(app_root))
    os.chdir(app_root)
    sys.argv = [str(app_root / "app.py"), *sys.argv[1:]]
    import app

    sys.exit(app.main())
