"""The fastest settings for vLLM's CPU engine on the processor at hand.

Measured on a 2-core AMD EPYC with AVX512-BF16 (bench/cpu_engine.py, then through the app with
bench/run.py; numbers in docs/benchmarks.md): bfloat16 instead of float32 is 1.6x as fast there, the
engine's threads on both cores instead of one (vLLM reserves a core for the front end) 1.4x for one
stream and 1.6x for 16, tcmalloc another 1.1x at 16 streams. On CPUs without AVX512-BF16 the
bfloat16 kernels are emulated and float32 is about 3x as fast (../shared/ENGINEERING.md), so the
dtype is chosen per CPU. Settings the user gave (a preset's dtype, the environment) always win.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

# Where Debian/Ubuntu (libtcmalloc-minimal4) and Fedora (gperftools-libs) put tcmalloc.
TCMALLOC_PATHS = (
    Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"),
    Path("/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4"),
    Path("/usr/lib64/libtcmalloc_minimal.so.4"),
)
# With this many cores or fewer, the core vLLM reserves for the front end is too large a share of
# the machine: the engine's threads get every core and share one with the front end.
SMALL_MACHINE_CORES = 4
WORKER_SHUTDOWN_GRACE_S = "1"  # an engine's stop: 5.0 s -> 3.7 s on the 2-core machine


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.partition(":")[2].split())
    return set()


def best_dtype(flags: set[str] | None = None) -> str:
    """bfloat16 where the CPU computes it natively, float32 elsewhere."""
    flags = cpu_flags() if flags is None else flags
    return "bfloat16" if flags & {"avx512_bf16", "amx_bf16"} else "float32"


def tune_environment(env: MutableMapping[str, str] = os.environ, cores: Sequence[int] | None = None) -> dict[str, str]:
    """Set, in `env`, what the engine's processes should start with (they inherit it), unless the
    user already set it (an empty LD_PRELOAD keeps tcmalloc out). `cores`: the ones this process
    may use. Returns what was set."""
    cores = sorted(os.sched_getaffinity(0)) if cores is None else cores
    chosen: dict[str, str] = {}
    if "VLLM_CPU_OMP_THREADS_BIND" not in env and len(cores) <= SMALL_MACHINE_CORES:
        chosen["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(core) for core in cores)
    if "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS" not in env:
        # The CPU worker does not notice its engine core's end by itself; vLLM sends it SIGTERM
        # after this grace (5 s by default), and kills the whole core at 5 s, with two warnings.
        chosen["VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"] = WORKER_SHUTDOWN_GRACE_S
    if "LD_PRELOAD" not in env:
        library = next((path for path in TCMALLOC_PATHS if path.is_file()), None)
        if library:
            chosen["LD_PRELOAD"] = str(library)
    env.update(chosen)
    if chosen:
        log.info("CPU engine settings for this machine: %s", chosen)
    return chosen
