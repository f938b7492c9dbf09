"""The CPU engine's settings for the processor at hand (the engine's own test checks the real one)."""

from __future__ import annotations

from chat import cpu


def test_bfloat16_only_where_the_cpu_computes_it(tmp_path):
    assert cpu.best_dtype({"avx2", "avx512f", "avx512_bf16"}) == "bfloat16"
    assert cpu.best_dtype({"amx_bf16"}) == "bfloat16"
    assert cpu.best_dtype({"avx2", "fma"}) == "float32"
    assert cpu.best_dtype(set()) == "float32"
    info = tmp_path / "cpuinfo"
    info.write_text("processor : 0\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor : 1\nflags : fpu avx2 avx512_bf16\n")
    assert cpu.cpu_flags(info) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu.cpu_flags(tmp_path / "missing") == set()


def test_small_machines_give_the_engine_every_core(monkeypatch):
    monkeypatch.setattr(cpu, "TCMALLOC_PATHS", ())
    grace = {"VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": cpu.WORKER_SHUTDOWN_GRACE_S}
    env: dict[str, str] = {}
    assert cpu.tune_environment(env, cores=[0, 1]) == {"VLLM_CPU_OMP_THREADS_BIND": "0,1", **grace}
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0,1"
    assert cpu.tune_environment({}, cores=[2, 5]) == {"VLLM_CPU_OMP_THREADS_BIND": "2,5", **grace}, "the cores it may use"
    large: dict[str, str] = {}
    assert cpu.tune_environment(large, cores=range(16)) == grace, "big machines keep vLLM's own binding"


def test_what_the_user_set_wins(monkeypatch, tmp_path):
    library = tmp_path / "libtcmalloc_minimal.so.4"
    library.write_bytes(b"")
    monkeypatch.setattr(cpu, "TCMALLOC_PATHS", (tmp_path / "absent.so", library))
    env = {"VLLM_CPU_OMP_THREADS_BIND": "auto", "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": "5"}
    assert cpu.tune_environment(env, cores=[0, 1]) == {"LD_PRELOAD": str(library)}
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "auto", "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": "5",
                   "LD_PRELOAD": str(library)}
    mine = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "LD_PRELOAD": "", "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": "9"}
    untouched = dict(mine)
    assert cpu.tune_environment(untouched, cores=[0, 1]) == {}
    assert untouched == mine
