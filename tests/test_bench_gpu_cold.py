"""How bench/gpu.py --cold compares each path's first round with its others (issue 48, part 4)."""

from __future__ import annotations

import math

from bench.gpu import first_rounds, first_rounds_lines


def record(path: str, level: int, round_: int, tok_s: float, p99: float, errors: int = 0) -> dict:
    return {"path": path, "concurrency": level, "round": round_,
            "summary": {"tok_s": tok_s, "ttft_p99_ms": p99, "errors": errors}}


def test_the_first_round_against_the_median_of_the_others_per_path_raw_first():
    closed = [record("w8-browser", 256, 0, 800.0, 900.0), record("raw", 256, 0, 900.0, 500.0),
              record("raw", 256, 1, 1000.0, 400.0), record("w8-browser", 256, 1, 1000.0, 600.0, errors=1),
              record("raw", 256, 3, 1200.0, 300.0), record("raw", 256, 2, 1100.0, 350.0)]  # out of order

    raw, app = first_rounds(closed)

    assert (raw["path"], raw["rounds"], raw["tok_s"]) == ("raw", 4, [900.0, 1000.0, 1100.0, 1200.0])
    assert raw["first_x_others_tok_s"] == round(900 / 1100, 3)
    assert raw["first_x_others_ttft_p99"] == round(500 / 350, 3)
    assert (app["path"], app["first_x_others_tok_s"], app["errors"]) == ("w8-browser", 0.8, [0, 1])
    assert "first round / median of the others: tok/s 0.82" in first_rounds_lines([raw, app])[0]


def test_no_ratio_without_other_rounds_or_where_the_first_had_no_reply():
    alone, empty = first_rounds([record("raw", 8, 0, 500.0, 100.0), record("app", 8, 0, math.nan, math.nan),
                                 record("app", 8, 1, 400.0, 90.0)])

    assert alone["first_x_others_tok_s"] is None
    assert empty["path"] == "app" and empty["first_x_others_tok_s"] is None
    assert "tok/s -, 400" in first_rounds_lines([empty])[0]
