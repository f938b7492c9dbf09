"""The model the GPU benchmarks (bench/gpu.py, bench/gpu_ops.py) run: a known geometry with SmolLM2's
tokenizer and no weights on disk; vLLM makes them at random on the device (load_format: dummy), so
replies are gibberish and only the timings mean anything.

    cfg = write_model(Path("/tmp/model-8b"), Path(".gpu/tok"), "8b")   # config.json, tokenizer, generation_config
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

SHAPES = {
    # Llama-3-8B geometry with SmolLM2's 49152-token vocabulary (about 7.4 B parameters)
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, rope_theta=500000.0, tie_word_embeddings=False),
    # SmolLM2-135M geometry (smoke runs)
    "135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                 num_key_value_heads=3, head_dim=64, rope_theta=100000.0, tie_word_embeddings=True),
}


def write_model(model_dir: Path, tok_dir: Path, shape: str) -> dict[str, Any]:
    """A model folder of `shape`: its config.json (returned), generation_config.json and the tokenizer's files."""
    model_dir.mkdir(parents=True, exist_ok=True)
    s = dict(SHAPES[shape])
    theta = s.pop("rope_theta")
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
           "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "vocab_size": 49152, "bos_token_id": 1,
           "eos_token_id": 2, "pad_token_id": 2, "attention_bias": False, "mlp_bias": False,
           "torch_dtype": "bfloat16", "dtype": "bfloat16", "initializer_range": 0.02, "use_cache": True,
           "rope_theta": theta, "rope_parameters": {"rope_theta": theta, "rope_type": "default"}, **s}
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=1))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (tok_dir / name).exists():
            shutil.copy(tok_dir / name, model_dir / name)
    (model_dir / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2,
                                                                   "pad_token_id": 2}))
    return cfg
