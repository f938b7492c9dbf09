"""The same model with plain transformers `generate()`, on the same machine: a yardstick for vLLM's CPU engine.

    .venv/bin/python -m bench.transformers_baseline                 # 1 stream and a batch of 16
    .venv/bin/python -m bench.transformers_baseline --threads 1     # one core, as vLLM's worker gets

Loads the embedded SmolLM2-135M-Instruct folder (the one vLLM serves), renders the benchmark's chat
prompts with the model's chat template, and generates exactly --max-tokens tokens per reply
(min_new_tokens = max_new_tokens, so end-of-sequence never stops early) with the benchmark's
sampling (temperature 0.7, top-p 0.9, repetition penalty 1.1), KV cache on. A batch is left-padded.
Reports output tokens/s: all generated tokens over the wall time of the generate() call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from bench.common import REPETITION_PENALTY, TEMPERATURE, TOP_P, chat_messages


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.transformers_baseline", description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,16", help="batch sizes (simultaneous streams)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 leaves torch's default")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from chat.embedded import ensure_converted

    if args.threads:
        torch.set_num_threads(args.threads)
    folder = ensure_converted(report=lambda line: print(line, file=sys.stderr))
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=getattr(torch, args.dtype))
    model.eval()
    results: dict[str, Any] = {"threads": torch.get_num_threads(), "dtype": args.dtype, "max_tokens": args.max_tokens,
                               "torch": torch.__version__, "runs": {}}
    index = 0
    for batch in (int(x) for x in args.batches.split(",")):
        rates = []
        for repeat in range(args.repeats + 1):  # the first is a warm-up
            texts = [tok.apply_chat_template(chat_messages(index + i), tokenize=False, add_generation_prompt=True)
                     for i in range(batch)]
            index += batch
            inputs = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(**inputs, max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens,
                                     do_sample=True, temperature=TEMPERATURE, top_p=TOP_P,
                                     repetition_penalty=REPETITION_PENALTY, pad_token_id=tok.pad_token_id)
            wall = time.perf_counter() - t0
            generated = (out.shape[1] - inputs["input_ids"].shape[1]) * batch
            if repeat:
                rates.append(generated / wall)
        results["runs"][batch] = {"tok_s": rates, "median_tok_s": statistics.median(rates)}
        print(f"transformers generate(), batch {batch:>3}: {statistics.median(rates):6.1f} output tok/s "
              f"(runs: {', '.join(f'{r:.1f}' for r in rates)}; {torch.get_num_threads()} threads, {args.dtype})",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
