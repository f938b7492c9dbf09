"""Markdown tables from result files, for docs/benchmarks.md.

    .venv/bin/python -m bench.report bench/results/cpu-main.json
    .venv/bin/python -m bench.report bench/results/gpu-1/gpu-*.json bench/results/gpu-2/gpu-*.json
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from bench.common import Summary


def num(x: float | None, spec: str = "{:.0f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else spec.format(x)


def rows(summaries: list[Summary], base: str = "raw") -> str:
    by = {(s.path, s.concurrency): s for s in summaries}
    out = ["| streams | path | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | tok/s | vs raw tok/s | front-end CPU s / 1k tok |",
           "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    paths = sorted({s.path for s in summaries}, key=lambda p: (p != base, p))
    for c in sorted({s.concurrency for s in summaries}):
        for p in paths:
            s = by.get((p, c))
            if s is None:
                continue
            b = by.get((base, c))
            ratio = "" if p == base or b is None else num(s.tok_s / b.tok_s, "{:.2f}")
            diff = "" if p == base or b is None else f" ({s.ttft_p50_ms - b.ttft_p50_ms:+.0f})"
            out.append(f"| {c} | {p} | {num(s.ttft_p50_ms)}{diff} | {num(s.ttft_p99_ms)} | {num(s.itl_p50_ms, '{:.1f}')} | "
                       f"{num(s.itl_p99_ms, '{:.1f}')} | {num(s.tok_s, '{:.1f}' if s.tok_s < 1000 else '{:.0f}')} | "
                       f"{ratio} | {num(s.cpu_s_per_1k, '{:.2f}')} |")
    return "\n".join(out)


def median_rows(runs: list[dict[str, Any]], base: str = "raw") -> str:
    """Each figure's median over repeats, and the median of the per-repeat ratios to `base` (the
    ratio is taken within a repeat, so drift between repeats cancels)."""
    import statistics

    def med(xs: list[float]) -> float:
        xs = [x for x in xs if x is not None and not math.isnan(x)]
        return statistics.median(xs) if xs else math.nan

    out = ["| streams | path | repeats | TTFT p50 | vs raw (ms) | TTFT p99 | ITL p50 | ITL p99 | tok/s | vs raw | CPU s / 1k tok |",
           "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    keys = sorted({(r["concurrency"], r["path"]) for r in runs}, key=lambda k: (k[0], k[1] != base, k[1]))
    for c, p in keys:
        mine = [r for r in runs if r["path"] == p and r["concurrency"] == c]
        diffs, ratios = [], []
        for r in mine:
            b = next((x for x in runs if x["path"] == base and x["concurrency"] == c and x["repeat"] == r["repeat"]), None)
            if b is not None and p != base:
                diffs.append(r["summary"]["ttft_p50_ms"] - b["summary"]["ttft_p50_ms"])
                ratios.append(r["summary"]["tok_s"] / b["summary"]["tok_s"])

        def m(key: str, mine: list[dict[str, Any]] = mine) -> float:
            return med([r["summary"][key] for r in mine])

        tok = m("tok_s")
        out.append(f"| {c} | {p} | {len(mine)} | {num(m('ttft_p50_ms'))} | {num(med(diffs), '{:+.0f}') if diffs else ''} | "
                   f"{num(m('ttft_p99_ms'))} | {num(m('itl_p50_ms'), '{:.1f}')} | {num(m('itl_p99_ms'), '{:.1f}')} | "
                   f"{num(tok, '{:.1f}' if tok < 1000 else '{:.0f}')} | {num(med(ratios), '{:.2f}') if ratios else ''} | "
                   f"{num(m('cpu_s_per_1k'), '{:.2f}')} |")
    return "\n".join(out)


def cpu_report(data: dict[str, Any]) -> str:
    parts = [f"{data['date']} · {data['machine']['cpu']}, {data['machine']['cores']} cores · "
             + ", ".join(f"{k} {v}" for k, v in data["versions"].items())]
    for phase in ("paths", "flush"):
        ph = data["phases"].get(phase) or {}
        base = "raw" if phase == "paths" else "app"
        if "summary" in ph:
            parts.append(f"\n{phase}, all repeats pooled:\n\n" + rows([Summary(**s) for s in ph["summary"]], base))
        if ph.get("runs"):
            parts.append(f"\n{phase}, medians over repeats:\n\n" + median_rows(ph["runs"], base))
    spread = data["phases"].get("paths", {}).get("per_repeat_vs_raw")
    if spread:
        parts.append("\nper repeat, tok/s ratio to raw and TTFT p50 difference (ms):\n")
        parts += [f"- {k}: {v['tok_s_ratio']}, {v['ttft_p50_diff_ms']}" for k, v in spread.items()]
    runs = data["phases"].get("paths", {}).get("runs", [])
    if runs:
        others = sorted(r["foreign_cores"] for r in runs if r.get("foreign_cores") is not None)
        parts.append(f"\nother processes' CPU during runs: median {others[len(others) // 2]:.2f}, max {others[-1]:.2f} cores")
    return "\n".join(parts)


def gpu_report(data: dict[str, Any]) -> str:
    parts = [f"{data['date']} · {data['gpu']} · vLLM {data['versions'].get('vllm')} · weights: {data['weights']}"]
    summaries = [Summary(**r["summary"]) for r in data["closed"]]
    parts.append("\n" + rows(summaries))
    if data.get("rates"):
        parts.append("\n| rate (req/s) | path | TTFT p50 | TTFT p99 | Gradio queue p99 | ITL p50 | tok/s | CPU s / 1k |")
        parts.append("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in data["rates"]:
            s = r["summary"]
            parts.append(f"| {r['rate']:g} | {r['path']} | {num(s['ttft_p50_ms'])} | {num(r['p99_ttft_ms'])} | "
                         f"{num(s.get('queue_p99_ms'))} | {num(s['itl_p50_ms'], '{:.1f}')} | {num(s['tok_s'])} | "
                         f"{num(s['cpu_s_per_1k'], '{:.2f}')} |")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    for name in argv if argv is not None else sys.argv[1:]:
        data = json.loads(Path(name).read_text())
        print(f"## {name}\n")
        print(gpu_report(data) if "closed" in data else cpu_report(data))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
