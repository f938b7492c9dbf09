"""A mixed load: a burst of chat streams through the browser's path while visitors compare presets.

    record = mixed_load(url, browser, chat=128, visitors=16, presets=(a, b), ...)

Each visitor is a gradio_client (it keeps the front door's cookie, as a browser does) that sends
one prompt to two presets on different engines through `/compare`, in a new comparison each time,
again and again until the chat burst has ended. The burst is measured as in the closed loop (bench.paths.measure); each
comparison's columns give their time to first token from their stats lines.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from bench.paths import Target, measure
from chat.stats import SUMMARY


def _first_token_ms(title: str) -> float | None:
    found = SUMMARY.search(title or "")
    if found is None:
        return None
    return 1000 * float(found["first"].replace(",", ""))


def mixed_load(url: str, browser: Target, chat: int, visitors: int, presets: tuple[str, str], max_tokens: int,
               first_index: int, our_pids: list[int], prompt: str) -> dict[str, Any]:
    from gradio_client import Client

    clients = [Client(url, verbose=False) for _ in range(visitors)]
    stop = threading.Event()
    compares: list[dict[str, Any]] = []
    started = threading.Barrier(visitors + 1)
    settings = {"max_tokens": max_tokens}

    def visit(client: Client) -> None:
        started.wait()
        while not stop.is_set():
            began = time.monotonic()
            try:
                client.reset_session()  # a new comparison each time (a session's follow-ups grow its prompt)
                result = client.predict(list(presets), False, prompt, [settings, settings], api_name="/compare")
                titles = [c["messages"][-1]["metadata"].get("title", "") for c in result["columns"]]
                refused = [t for t in titles if t.startswith("⚠")]
                compares.append({"s": time.monotonic() - began, "ttft_ms": [_first_token_ms(t) for t in titles],
                                 "error": refused[0] if refused else None})
            except Exception as exc:  # counted, not raised: the burst's numbers still stand
                compares.append({"s": time.monotonic() - began, "ttft_ms": [], "error": repr(exc)[:300]})

    threads = [threading.Thread(target=visit, args=(c,), daemon=True) for c in clients]
    for thread in threads:
        thread.start()
    started.wait()
    time.sleep(2.0)  # the comparisons are streaming when the burst arrives
    record = measure(browser, chat, chat, first_index, max_tokens, our_pids, keep_timelines=False)
    stop.set()
    for thread in threads:
        thread.join(600)
    ttfts = sorted(t for c in compares for t in c["ttft_ms"] if t is not None)
    record["mixed"] = {
        "visitors": visitors, "presets": list(presets), "comparisons": len(compares),
        "comparison_errors": [c["error"] for c in compares if c["error"]][:5],
        "comparison_s": [round(c["s"], 2) for c in compares],
        "comparison_ttft_ms_p50": ttfts[len(ttfts) // 2] if ttfts else None,
        "comparison_ttft_ms_p99": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else None,
    }
    return record
