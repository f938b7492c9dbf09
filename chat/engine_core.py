"""An engine core that several processes share: started once, every UI worker a client of it.

The other half of the engine layer (chat/engine.py is the first); everything here speaks vLLM. As
`vllm serve --api-server-count N` does, the core (the scheduler and the model, in processes of their
own) starts once with N client slots, and each front-end process holds an `AsyncLLM` on one slot:

    core = SharedCore(preset, folder, slots=8, sockets=private_dir)   # blocking: the processes start
    core.wait_ready()                                                 # blocking: the model is loaded
    llm = join_core(preset, folder, core.slot(3), stat_loggers)       # in a worker: its client

A slot's addresses are Unix sockets in a private folder; each client binds its own when it joins,
and the core keeps trying to connect to every slot from its start, so a slot can go to a process
that ran long before the core, and no other local user can take its address. vLLM's core greets
each slot once, at its start (a client that joins the slot of one that died waits forever), so
each core has spare slots for replaced workers.
"""

from __future__ import annotations

import functools
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chat import cpu

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

    from chat.presets import Preset

log = logging.getLogger(__name__)

# How long an engine's processes may take to end once asked (vLLM's default is 5 s, then it kills
# them): ~1 s on the 2-core Xeon (~3 s while they ended with Python's teardown: chat/lifeline.py
# `spawned_processes_end_without_teardown`), a shared core's up to 4 s more (SharedCore.shutdown), and
# far more on a machine busy with other work, where a kill mid-teardown left shared memory behind.
CORE_STOP_S = 15.0


@functools.cache
def on_cpu() -> bool:
    """Whether the installed vLLM is its CPU build (from its metadata: chat/engine_vllm.py `installed`)."""
    from chat.engine_vllm import installed

    return installed()[1] == "cpu"


def engine_arguments(preset: Preset, folder: Path) -> dict[str, Any]:
    """The preset's engine arguments completed for this machine (on a CPU: the fastest dtype for the
    processor unless the preset names one, and the environment that suits it, chat/cpu.py)."""
    engine_args = dict(preset.engine)
    engine_args.setdefault("served_model_name", preset.model if preset.model_kind == "hub" else folder.name)
    # The weights' progress bars (five lines on the console at each start) with --verbose only, which
    # the app passes on in the environment (chat/logs.py).
    engine_args.setdefault("use_tqdm_on_load", os.environ.get("CHAT_VERBOSE") == "1")
    if on_cpu():
        engine_args.setdefault("dtype", cpu.best_dtype())
        cpu.tune_environment()
    return engine_args


def engine_args(preset: Preset, folder: Path) -> Any:
    """vLLM's AsyncEngineArgs for the preset's model in `folder`."""
    from vllm import AsyncEngineArgs

    return AsyncEngineArgs(model=str(folder), **engine_arguments(preset, folder))


@dataclass(frozen=True)
class EngineSlot:
    """One client's place at a shared core: the addresses it binds, how many clients the core serves
    and which one this is (plain data, sent to another process)."""

    input_address: str
    output_address: str
    count: int
    index: int
    stats_address: str | None = None  # vLLM's data-parallel coordinator, where there is one


def join_core(preset: Preset, folder: Path, slot: EngineSlot, stat_loggers: list[Any]) -> AsyncLLM:
    """Blocking: an AsyncLLM client on `slot` of a core started elsewhere, once the core has greeted it."""
    from vllm.v1.engine.async_llm import AsyncLLM

    args = engine_args(preset, folder)
    args._api_process_count, args._api_process_rank = slot.count, slot.index
    addresses: dict[str, Any] = {"input_address": slot.input_address, "output_address": slot.output_address}
    if slot.stats_address is not None:
        addresses["stats_update_address"] = slot.stats_address
    return AsyncLLM.from_vllm_config(
        args.create_engine_config(), stat_loggers=stat_loggers, client_addresses=addresses,
        client_count=slot.count, client_index=slot.index,
    )


class SharedCore:
    """The engine core of one preset's configuration, with `slots` client slots."""

    def __init__(self, preset: Preset, folder: Path, slots: int, sockets: Path) -> None:
        """Blocking: start the core's processes (the model then loads; `wait_ready` waits for it)."""
        from vllm.v1.engine import utils as engine_utils
        from vllm.v1.executor import Executor

        args = engine_args(preset, folder)
        args._api_process_count, args._api_process_rank = slots, -1
        config = args.create_engine_config()
        self.slots = slots
        tag = uuid.uuid4().hex[:12]
        addresses = engine_utils.EngineZmqAddresses(
            inputs=[f"ipc://{sockets}/{tag}-in-{i}" for i in range(slots)],
            outputs=[f"ipc://{sockets}/{tag}-out-{i}" for i in range(slots)],
        )
        executor = Executor.get_class(config)
        if hasattr(engine_utils, "bind_engine_zmq_listeners"):  # vLLM 0.32: one object, the barrier on exit
            self._launch = engine_utils.launch_core_engines(config, executor, True, addresses)
            launched = self._launch.__enter__()
            self.manager, self.coordinator = launched.engine_manager, launched.coordinator
        else:  # vLLM 0.25 (the GPU host's): a tuple, and the number of clients passed in
            self._launch = engine_utils.launch_core_engines(config, executor, True, addresses, slots)
            self.manager, self.coordinator, _, _ = self._launch.__enter__()
        self.addresses = addresses
        log.info("Engine core for %r started with %d client slots", preset.name, slots)

    def wait_ready(self) -> None:
        """Blocking: return once the core has loaded the model (vLLM's start-up barrier)."""
        self._launch.__exit__(None, None, None)

    def slot(self, index: int) -> EngineSlot:
        stats = self.coordinator.get_stats_publish_address() if self.coordinator is not None else None
        return EngineSlot(self.addresses.inputs[index], self.addresses.outputs[index], self.slots, index, stats)

    @property
    def sentinels(self) -> list[int]:
        """Descriptors that become readable when one of the core's processes ends (multiprocessing's)."""
        return [p.sentinel for p in getattr(self.manager, "processes", [])]

    def shutdown(self) -> None:
        """Blocking: stop the core's processes (within CORE_STOP_S: its teardown waits up to 4 s, ZMQ's
        linger, to tell each slot that it stops, and a gone or spare client never takes it) and remove its sockets."""
        if self.manager is not None:
            self.manager.shutdown(timeout=CORE_STOP_S)
        if self.coordinator is not None:
            self.coordinator.shutdown()
        for address in (*self.addresses.inputs, *self.addresses.outputs):
            Path(address.removeprefix("ipc://")).unlink(missing_ok=True)
