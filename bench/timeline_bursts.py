"""Were the slow replies of a steady-rate run slow alone, or together? From the moments the app's
processes recorded (bench/frontend_timeline.py: `begin` received, first text sent), per run of
arrivals: how long from `begin` to the first text (p50, p99), and the largest cluster of `begin`s
that reached the app within WINDOW_MS of each other (at 10 a second they should be ~100 ms apart),
with that cluster's wait.

    python -m bench.timeline_bursts TIMELINE_DIR            # the timeline-*.jsonl of one app's processes
    python -m bench.timeline_bursts --save out.json DIR     # also keep the moments (small) for later
    python -m bench.timeline_bursts moments.json            # from moments saved so
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

WINDOW_MS = 20.0  # `begin`s closer than this arrived together
GAP_S = 3.0  # a pause this long between `begin`s ends one run of arrivals


def moments(source: Path) -> list[tuple[float, float]]:
    """(begin, first text sent) of every reply, by `begin`."""
    if source.is_file():
        return sorted((b, d) for b, d in json.loads(source.read_text())["replies"])
    from bench.frontend_rates import read_lines

    out = []
    for path in sorted(source.glob("timeline-*.jsonl")):
        lines = read_lines(path, 0)
        sent = {m["id"]: m["t"] for m in reversed(lines) if m["k"] == "delta"}  # each reply's first
        out += [(m["t"], sent[m["id"]]) for m in lines if m["k"] == "begin" and m["id"] in sent]
    return sorted(out)


def runs(replies: list[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    out: list[list[tuple[float, float]]] = []
    for reply in replies:
        if out and reply[0] - out[-1][-1][0] < GAP_S:
            out[-1].append(reply)
        else:
            out.append([reply])
    return out


def largest_cluster(run: list[tuple[float, float]]) -> list[tuple[float, float]]:
    best: list[tuple[float, float]] = []
    start = 0
    for end in range(len(run)):
        while (run[end][0] - run[start][0]) * 1e3 > WINDOW_MS:
            start += 1
        if end - start + 1 > len(best):
            best = run[start:end + 1]
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path, help="a folder of timeline-*.jsonl, or moments saved with --save")
    ap.add_argument("--save", type=Path, help="write the (begin, sent) moments here")
    args = ap.parse_args()
    replies = moments(args.source)
    if args.save:
        args.save.write_text(json.dumps({"replies": [[round(b, 4), round(d, 4)] for b, d in replies]}))
    print(f"{'at s':>7} {'replies':>7} {'per s':>6} {'p50 ms':>7} {'p99 ms':>7}  largest cluster: begins, span ms, s into the run, wait ms")
    for run in runs(replies):
        waits = sorted((d - b) * 1e3 for b, d in run)
        seconds = max(run[-1][0] - run[0][0], 1e-9)
        cluster = largest_cluster(run)
        cluster_waits = [(d - b) * 1e3 for b, d in cluster]
        p99 = waits[min(len(waits) - 1, int(len(waits) * 0.99))]
        print(f"{run[0][0]:7.0f} {len(run):7} {len(run) / seconds:6.1f} {statistics.median(waits):7.0f} {p99:7.0f}  "
              f"{len(cluster)}, {(cluster[-1][0] - cluster[0][0]) * 1e3:.0f}, {cluster[0][0] - run[0][0]:.1f}, "
              f"{min(cluster_waits):.0f}-{max(cluster_waits):.0f}")


if __name__ == "__main__":
    main()
