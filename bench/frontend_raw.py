"""The raw side of bench/frontend_rates.py: vLLM's AsyncLLM over the token source, driven directly in a
process of its own (bench/raw_engine.py's ops), as the app's process drives it but with no front end.

    BENCH_STEP_MS=25 BENCH_APP_CPUS=0 python bench/frontend_raw.py --preset bench/presets/frontend/token-source.yaml

BENCH_APP_ROOT (default this checkout) is where `chat` is imported from, as for the app it is
compared with (bench/frontend_app.py); BENCH_APP_CPUS and BENCH_NICE pin and prioritise it alike.
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
    sys.path.insert(0, str(ROOT))
    if os.environ.get("BENCH_NICE"):
        from bench.procs_priority import prioritize

        prioritize(int(os.environ["BENCH_NICE"]))
    sys.path.insert(0, str(Path(os.environ.get("BENCH_APP_ROOT") or ROOT).resolve()))  # its chat/, ahead of ours
    from bench import raw_engine
    from bench.token_source import install

    install(step_s=float(os.environ.get("BENCH_STEP_MS", "25")) / 1000)
    raw_engine.main()
