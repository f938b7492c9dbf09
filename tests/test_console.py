"""The console: a few lines to read while the engine starts, then the address to open."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time

import pytest

from chat import logs
from tests.conftest import app_command, finished, ran_app
from tests.test_presets import GOOD, MANY_MISTAKES, error_of, write

VLLM_INFO = re.compile(r"\) INFO \d\d-\d\d |\bINFO vllm\b")  # vLLM's own format, or vLLM through the app's


def record(message: str, level: int = logging.WARNING, *args: object) -> logging.LogRecord:
    return logging.LogRecord("vllm.loader", level, "loader.py", 1, message, args, None)


def test_a_warning_repeated_for_every_weight_is_shown_once_and_errors_always():
    once = logs.OncePerMessage()
    template = "Attempted to load weight %s with dtype %s into parameter with dtype %s"
    assert once.filter(record(template, logging.WARNING, "a", "f16", "bf16"))
    assert not once.filter(record(template, logging.WARNING, "b", "f16", "bf16"))
    assert once.filter(record("Another warning"))
    assert once.filter(record("Engine died", logging.ERROR)) and once.filter(record("Engine died", logging.ERROR))


def test_known_harmless_warnings_stay_off_the_console_and_the_rest_reach_it():
    known = logs.KnownHarmless()
    harmless = [
        record("Casting %s to %s.", logging.WARNING, "torch.float16", "torch.bfloat16"),
        record("Triton is not installed. triton-cpu is expected on x86 CPUs."),
        record("[shutdown] Executor: workers still running after grace period; sending SIGTERM count=1"),
        logging.LogRecord("py.warnings", logging.WARNING, "", 0, "/x/dispatcher.py:138: FutureWarning: "
                          "`torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp`", (), None),
    ]
    assert not [r.getMessage() for r in harmless if known.filter(r)]
    assert known.filter(record("Casting torch.bfloat16 to torch.float16."))  # loses precision: the user should know
    assert known.filter(record("Triton is not installed.", logging.ERROR))  # errors always pass
    assert known.filter(record("Something vLLM has never said before"))


@pytest.fixture
def restore_loggers(monkeypatch):
    """`configure` changes the process's loggers and environment: put them back. (monkeypatch undoes
    its own changes only: a variable it deleted while absent, configure set, and it stayed set: a later
    test's app started with CHAT_VERBOSE=1, verbose.)"""
    environment = {name: os.environ.pop(name, None)
                   for name in (logs.VERBOSE_ENV, "TORCH_CPP_LOG_LEVEL", "VLLM_LOGGING_LEVEL", "VLLM_LOGGING_CONFIG_PATH")}
    root = logging.getLogger()
    levels = {name: logging.getLogger(name).level for name in (*logs.CHATTY, "vllm", "chat", "")}
    handlers = list(root.handlers)
    yield
    for name, value in environment.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    root.handlers[:] = handlers
    logging.captureWarnings(False)


@pytest.mark.usefixtures("restore_loggers")
def test_by_default_vllm_shows_warnings_once_and_keeps_what_the_user_set(monkeypatch):
    for name in ("VLLM_LOGGING_LEVEL", "VLLM_LOGGING_CONFIG_PATH", "VLLM_CONFIGURE_LOGGING"):
        monkeypatch.delenv(name, raising=False)
    logs.configure(verbose=False)
    assert (os.environ["VLLM_LOGGING_LEVEL"], os.environ["VLLM_LOGGING_CONFIG_PATH"]) == ("WARNING", str(logs.VLLM_CONFIG))
    assert (os.environ[logs.VERBOSE_ENV], os.environ["TORCH_CPP_LOG_LEVEL"]) == ("0", "ERROR")  # for the engines' processes
    assert logging.getLogger("httpx").level == logging.WARNING

    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    monkeypatch.setenv("VLLM_CONFIGURE_LOGGING", "0")  # a config file would then stop vLLM from starting
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH")
    logs.configure(verbose=False)
    assert os.environ["VLLM_LOGGING_LEVEL"] == "DEBUG" and "VLLM_LOGGING_CONFIG_PATH" not in os.environ


@pytest.mark.usefixtures("restore_loggers")
def test_verbose_leaves_vllm_as_it_is(monkeypatch):
    for name in ("VLLM_LOGGING_LEVEL", "VLLM_LOGGING_CONFIG_PATH"):
        monkeypatch.delenv(name, raising=False)
    logs.configure(verbose=True)
    assert "VLLM_LOGGING_LEVEL" not in os.environ and "VLLM_LOGGING_CONFIG_PATH" not in os.environ
    assert os.environ[logs.VERBOSE_ENV] == "1" and "TORCH_CPP_LOG_LEVEL" not in os.environ
    assert logging.getLogger("httpx").level == logging.INFO


def test_the_ready_line_is_one_sentence_with_the_address():
    assert logs.ready_line("Tiny", "http://127.0.0.1:7860/") == "==> Tiny is ready: open http://127.0.0.1:7860/ in your browser."
    assert logs.ready_line("Tiny", "http://a/", "https://b.gradio.live") == (
        "==> Tiny is ready: open http://a/ (or https://b.gradio.live from anywhere) in your browser."
    )


@pytest.mark.app
def test_check_presets_prints_every_problem_and_vllms_info_lines_only_when_verbose(tmp_path):
    """`app.py --check-presets`, one run each way (each imports vLLM, ~13 s of CPU on a 2-core EPYC):
    quiet on the bundled presets, which pass with no line of vLLM's; verbose on three files, two with
    problems, each problem printed with its file and line and the run failed, and vLLM's INFO lines back."""
    write(tmp_path, "good.yaml", GOOD)
    write(tmp_path, "qwen.yaml", GOOD.replace("Tiny", "Other").replace("max_model_len: 1024", "max_num_seq: 8"))
    write(tmp_path, "many.yaml", MANY_MISTAKES)
    verbose = app_command("--check-presets", "--verbose", "--presets-dir", str(tmp_path))  # meanwhile, on the other core
    quiet = ran_app("--check-presets")
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert vllm_info_lines(quiet) == [] and "0 invalid" in quiet.stdout

    result = finished(verbose)
    assert result.returncode == 1, result.stdout + result.stderr
    printed = result.stdout.splitlines()
    assert f"{tmp_path}/qwen.yaml, line 5: unknown engine key 'max_num_seq' - did you mean 'max_num_seqs'?" in printed
    many = [line for line in printed if line.startswith(f"{tmp_path}/many.yaml, line ")]
    assert len(many) == 9 and many == error_of(tmp_path / "many.yaml").replace("many.yaml", f"{tmp_path}/many.yaml").splitlines()
    assert "1 valid, 2 invalid preset file(s)." in printed
    assert vllm_info_lines(result)


def vllm_info_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if VLLM_INFO.search(line)]


def test_the_console_ends_the_engine_start_with_the_address_to_open(real_app):
    """The real engine's app's own console, from its start (vLLM's processes write to it too): the address
    comes again once the engine is ready."""
    ready = re.compile(r"^==> .+ is ready: open (\S+) in your browser\.$")
    deadline = time.monotonic() + 240
    while True:
        lines = real_app.log_path.read_text(errors="replace").splitlines()
        announced = [i for i, line in enumerate(lines) if ready.match(line)]
        if announced or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert announced, "no ready line within 240 s:\n" + real_app.log_tail()
    start = lines[: announced[0] + 1]
    assert ready.match(start[-1]).group(1) == real_app.url
    engine_ready = [i for i, line in enumerate(start) if re.search(r"Engine for .+ ready in [\d.]+ s", line)]
    assert engine_ready and engine_ready[0] < announced[0], "the address comes after the engine is ready"
    assert any("Running on local URL" in line for line in start[: engine_ready[0]]), "and the first address before it"
    assert [line for line in start if VLLM_INFO.search(line)] == [], "vLLM's INFO lines stay off the console"
    assert sum("Attempted to load weight" in line for line in start) <= 1, "a warning repeated per weight shows once"
    # The app's own lines: Gradio's address and hint, the engine's start and its end. On a fresh
    # machine scripts/setup adds six more (the install's four, the conversion's, the venv's): 12 in all.
    assert len(start) - 1 <= 6, "\n".join(start)
