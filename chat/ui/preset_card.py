"""The preset card beside the chat: what a preset is for, in plain words, then its engine settings.

Plain words come first (what the model is good for, what hardware it needs, how long a
conversation it can hold); vLLM's engine arguments follow, with units, under a fold that people
who do not run servers can leave closed.
"""

from __future__ import annotations

import html
from typing import Any

from chat.presets import Preset

WORDS_PER_TOKEN = 0.75  # English prose, roughly; enough for "about N words"

# What a yes/no engine argument does when it is on, in a few words.
_SWITCHES = {
    "enforce_eager": "skips graph compilation, so the engine starts sooner and writes a little slower",
    "enable_prefix_caching": "reuses the work already done for a conversation's earlier messages",
    "enable_chunked_prefill": "splits long prompts into pieces, so other replies keep flowing meanwhile",
    "trust_remote_code": "runs Python code that comes with the model",
    "disable_log_stats": "no engine statistics in the log",
    "enable_sleep_mode": "the engine can free its GPU memory while idle",
}

# What a text-valued engine argument's value means.
_CHOICES = {
    ("scheduling_policy", "priority"): "priority: visitors go before a capacity test's simulated users",
    ("scheduling_policy", "fcfs"): "first come, first served",
}

# How to read a number-valued engine argument: a function from its value to words.
_AMOUNTS = {
    "max_model_len": lambda v: f"{_count(v)} tokens per conversation (prompt and reply together)",
    "max_num_seqs": lambda v: f"{_count(v)} replies written at once, at most",
    "max_num_batched_tokens": lambda v: f"{_count(v)} tokens per engine step, at most",
    "tensor_parallel_size": lambda v: f"each layer split across {_count(v)} GPU{'s' if v != 1 else ''}",
    "pipeline_parallel_size": lambda v: f"the layers spread over {_count(v)} stage{'s' if v != 1 else ''}",
    "gpu_memory_utilization": lambda v: f"{v * 100:g}% of each GPU's memory",
    "swap_space": lambda v: f"{v:g} GiB of memory per GPU to park paused replies",
    "cpu_offload_gb": lambda v: f"{v:g} GiB of the model kept in the computer's memory",
    "kv_cache_memory_bytes": lambda v: f"{binary_size(v)} kept for the replies being written (the KV cache)",
    "seed": lambda v: f"{v}",
}


def preset_card(preset: Preset) -> str:
    """The card as Markdown: plain words, then the technical details folded away."""
    lines = [f"**{html.escape(preset.name)}**: {html.escape(preset.description)}", ""]
    lines.append(f"- {_hardware(preset)}")
    length = preset.engine.get("max_model_len")
    if isinstance(length, int) and not isinstance(length, bool):
        lines.append(
            f"- Holds a conversation of up to {_count(length)} tokens "
            f"(about {_count(_roughly(length * WORDS_PER_TOKEN))} words), your messages and its replies together."
        )
    else:
        lines.append("- Holds a conversation as long as the model allows.")
    lines.append(f"- Model: {_model(preset)}")
    if preset.tags:
        lines.append(f"- Tags: {html.escape(', '.join(preset.tags))}")
    lines += ["", "<details><summary>Technical details</summary>", "", *_technical(preset), "", "</details>"]
    return "\n".join(lines)


def _hardware(preset: Preset) -> str:
    hardware = preset.hardware
    if not preset.needs_gpu:
        return "Runs on this computer's processor; no graphics card (GPU) needed."
    gpus = f"{hardware.gpus} NVIDIA GPU{'s' if hardware.gpus != 1 else ''}"
    if hardware.min_gpu_memory_gb:
        each = " each" if hardware.gpus != 1 else ""
        return f"Needs {gpus} with at least {hardware.min_gpu_memory_gb:g} GB of memory{each}."
    return f"Needs {gpus}."


def _model(preset: Preset) -> str:
    if preset.model_kind == "embedded":
        return "SmolLM2-135M-Instruct, built in (nothing to download)."
    if preset.model_kind == "folder":
        return f"from the folder `{html.escape(preset.model)}`."
    return (
        f"[{html.escape(preset.model)}](https://huggingface.co/{html.escape(preset.model)}), "
        "downloaded from Hugging Face the first time it is used."
    )


def _technical(preset: Preset) -> list[str]:
    # Every setting the file gives, those equal to vLLM's defaults too: "enforce_eager: false" beside
    # another preset's "true" is the difference a reader comparing them looks for.
    lines = ["vLLM engine settings this preset gives:", ""]
    lines += [f"- `{html.escape(key)}`: {engine_value(key, value)}" for key, value in preset.engine.items()]
    if not preset.engine:
        lines.append("- none: vLLM's defaults")
    if preset.timeout_s:
        lines += ["", f"A reply is stopped after {preset.timeout_s:g} s."]
    return lines


def engine_value(key: str, value: Any) -> str:
    """One engine argument's value as a person reads it: units, yes/no, and what it does."""
    if isinstance(value, bool):
        meaning = _SWITCHES.get(key)
        return f"yes ({meaning})" if value and meaning else ("yes" if value else "no")
    if isinstance(value, (int, float)):
        if key in _AMOUNTS:
            return _AMOUNTS[key](value)
        if key.endswith("_bytes"):
            return binary_size(value)
        return _count(value) if isinstance(value, int) else f"{value:g}"
    return html.escape(_CHOICES.get((key, str(value)), str(value)))


def binary_size(size: float) -> str:
    """Bytes in the largest binary unit that keeps a whole or short number: 1073741824 -> 1 GiB."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(size) >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size:g} bytes"


def _count(value: float) -> str:
    return f"{value:,.0f}"


def _roughly(value: float) -> float:
    """Two significant figures: 1536 -> 1500, a count nobody mistakes for exact."""
    return float(f"{value:.2g}")
