"""app.py from any checkout, unchanged, for bench/gpu.py: the code before a change beside the code after
it on one GPU, and every process's page-reply moments for steady arrivals' timelines.

    BENCH_APP_ROOT=/tmp/before python bench/gpu_app.py --port 7861 ...        # app.py's flags
    BENCH_TIMELINE_DIR=/tmp/res/timeline python bench/gpu_app.py ...

The app is imported from BENCH_APP_ROOT (default: this checkout) and runs as `python app.py` would.
Its UI workers and engine processes are spawned (multiprocessing's spawn re-runs this file as
`__mp_main__`), so each of them runs app.py's own `__mp_main__` part here too, and with
BENCH_TIMELINE_DIR each process records its moments in its own file there, timeline-<pid>.jsonl
(bench/frontend_timeline.py: a page's `begin` received, its reply's first text sent, the event
loop's stalls, long garbage collections). This checkout's bench package is looked up after the
app's own folder, so the app's `chat` is always the app's.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP_ROOT = Path(os.environ.get("BENCH_APP_ROOT") or ROOT).resolve()


def record_moments() -> None:
    folder = os.environ.get("BENCH_TIMELINE_DIR")
    if not folder:
        return
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))  # after the app's folder: bench from here, chat from the app
    from bench import frontend_timeline

    Path(folder).mkdir(parents=True, exist_ok=True)
    frontend_timeline.install(Path(folder) / f"timeline-{os.getpid()}.jsonl")


if __name__ == "__main__":
    os.environ["BENCH_APP_ROOT"] = str(APP_ROOT)  # absolute: the processes the app spawns start in APP_ROOT
    sys.path[0] = str(APP_ROOT)  # instead of bench/: `import app`, `chat` and the rest from the app's checkout
    os.chdir(APP_ROOT)
    record_moments()
    sys.argv = [str(APP_ROOT / "app.py"), *sys.argv[1:]]
    import app

    app.run()
elif __name__ == "__mp_main__":  # a process the app spawned: what app.py does in one (its own __mp_main__ part)
    record_moments()
    runpy.run_path(str(APP_ROOT / "app.py"), run_name="__mp_main__")
