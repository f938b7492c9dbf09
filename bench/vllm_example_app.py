"""Path 3: the architecture of vLLM's own Gradio example, for comparison only.

vLLM's examples/online_serving/gradio_openai_chatbot_webserver.py is a Gradio `ChatInterface`
whose synchronous callback calls vLLM's OpenAI-compatible server (a separate process) through the
synchronous `openai` client with `stream=True`. As published it then (1) joins every chunk and
returns the whole answer at once, and (2) keeps Gradio's default concurrency limit of 1, so one
reader is served at a time and everyone else waits in Gradio's queue: with C readers the last one
waits for C-1 whole replies before its first word (bench/run.py --example-limit-1 measures it).
Both would make the comparison meaningless, so this version, written here for the
benchmark, streams properly and lets everyone in:

- it yields the accumulated text after every delta (Gradio sends the diff), and
- `concurrency_limit=None` (pass --concurrency-limit 1 to see the original's default).

Everything else is the example's architecture: a sync generator (Gradio runs each step in its
thread pool, 40 threads by default), one shared sync `OpenAI` client, the chat template applied by
the server. Sampling values and the reply length are flags, sent as the example sends its own
(`extra_body` for vLLM's extra parameters); the system prompt is the app's, so prompts are equal.

    python -m vllm.entrypoints.openai.api_server --model DIR --port 8000 ...   # separately
    python bench/vllm_example_app.py --model-url http://127.0.0.1:8000/v1 --model NAME --port 7870
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

import gradio as gr
from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import REPETITION_PENALTY, SYSTEM_PROMPT, TEMPERATURE, TOP_P  # noqa: E402


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="vLLM's Gradio OpenAI chatbot example, streaming, for the benchmark.")
    ap.add_argument("--model-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("-m", "--model", required=True, help="the served model name")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=7870)
    ap.add_argument("--temp", type=float, default=TEMPERATURE)
    ap.add_argument("--top-p", type=float, default=TOP_P)
    ap.add_argument("--repetition-penalty", type=float, default=REPETITION_PENALTY)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ignore-eos", action="store_true", help="always write --max-tokens tokens (benchmarks)")
    ap.add_argument("--system-prompt", default=SYSTEM_PROMPT)
    ap.add_argument("--concurrency-limit", type=int, default=0,
                    help="Gradio's limit on replies at once; 0 means none (the published example keeps 1)")
    ap.add_argument("--max-threads", type=int, default=40,
                    help="Gradio's queue slots (and thread pool); Gradio's default is 40")
    return ap.parse_args()


def build(args: argparse.Namespace) -> gr.ChatInterface:
    client = OpenAI(api_key="EMPTY", base_url=args.model_url)

    def predict(message: str, history: list[dict]) -> Iterator[str]:
        messages = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
        messages += [{"role": m["role"], "content": m["content"]} for m in history if isinstance(m.get("content"), str)]
        messages.append({"role": "user", "content": message})
        stream = client.chat.completions.create(
            model=args.model,
            messages=messages,
            temperature=args.temp,
            top_p=args.top_p,
            max_tokens=args.max_tokens,
            stream=True,
            extra_body={"repetition_penalty": args.repetition_penalty, "ignore_eos": args.ignore_eos},
        )
        full_message = ""
        for chunk in stream:
            if chunk.choices:
                full_message += chunk.choices[0].delta.content or ""
                yield full_message  # the published example returns only after the loop

    return gr.ChatInterface(
        fn=predict,
        title="Chatbot Interface",
        description="vLLM's Gradio example, streaming (benchmark path 3)",
        api_name="chat",
        concurrency_limit=args.concurrency_limit or None,
    )


def main() -> None:
    args = parse_args()
    demo = build(args)
    demo.queue(default_concurrency_limit=args.concurrency_limit or None).launch(
        server_name=args.host, server_port=args.port, share=False, max_threads=args.max_threads
    )


if __name__ == "__main__":
    main()
