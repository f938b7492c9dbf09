"""Command-line flags and their environment variables, declared once.

The table drives `python app.py --help`, the environment fallbacks for hosted demos, and the
README's settings table (a test checks that every setting is documented there).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chat.api_schema import GRACE_S
from chat.pacing import FLUSH_S
from chat.presets import DEFAULT_PRESETS_DIR
from chat.votes import default_path as default_votes_path

DEFAULT_PRESET = "smollm2-135m-cpu"


@dataclass(frozen=True)
class Setting:
    name: str  # the flag is --name with dashes
    env: tuple[str, ...]  # environment variables read when the flag is absent, first wins
    default: Any
    help: str
    kind: type = str  # str, int, float, or bool for on/off switches

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


SETTINGS: tuple[Setting, ...] = (
    Setting("host", ("CHAT_HOST", "GRADIO_SERVER_NAME"), "127.0.0.1",
            "Address to listen on. The default serves this machine only; 0.0.0.0 serves the network."),
    Setting("port", ("CHAT_PORT", "GRADIO_SERVER_PORT", "PORT"), 7860, "Port to listen on.", int),
    Setting("preset", ("CHAT_PRESET",), DEFAULT_PRESET,
            "Preset shown first and loaded at start: its name or its file name without .yaml."),
    Setting("presets_dir", ("CHAT_PRESETS_DIR",), str(DEFAULT_PRESETS_DIR), "Folder of preset YAML files."),
    Setting("share", ("CHAT_SHARE",), False,
            "Also publish a temporary public gradio.live link. Off by default: anyone with the link can use your model.",
            bool),
    Setting("concurrency_limit", ("CHAT_CONCURRENCY_LIMIT",), 0,
            "Most replies written at once by the whole app, from every UI worker, the Chat and Compare tabs and both "
            "APIs together; more wait in one line, first come first served, their readers told so. 0 means no limit, "
            "so vLLM batches every user together.", int),
    Setting("auth", ("CHAT_AUTH",), "",
            "Require a login for the UI and the API: user:password, several separated by commas. Off by default."),
    Setting("admins", ("CHAT_ADMINS",), "",
            "User names from --auth, separated by commas, who may reset the leaderboard's votes and run capacity "
            "tests. Off by default."),
    Setting("admin_local", ("CHAT_ADMIN_LOCAL",), False,
            "Make anyone connecting from this machine (127.0.0.1 or ::1) an administrator. Off by default; leave it "
            "off behind a reverse proxy on the same machine, where every visitor connects from there.", bool),
    Setting("max_waiting", ("CHAT_MAX_WAITING",), 256,
            "Replies that may wait for a free slot (in an engine's batch, or in line under --concurrency-limit); "
            "beyond it new ones are refused at once with a busy message.",
            int),
    Setting("replies_per_visitor", ("CHAT_REPLIES_PER_VISITOR",), 16,
            "Replies one visitor (their voter cookie, else their address, IPv6 by its /64) may have written or waiting "
            "at once, from every tab, API and UI worker together; beyond it they are asked to wait for one. 0 means no "
            "cap.", int),
    Setting("flush_ms", ("CHAT_FLUSH_MS",), round(FLUSH_S * 1000),
            "Most often a streaming reply is redrawn, in milliseconds (the first token is always shown at once); "
            "0 redraws on every token.", int),
    Setting("resume_grace_s", ("CHAT_RESUME_GRACE_S",), GRACE_S,
            "Seconds a WebSocket API reply keeps running after its connection drops, waiting for the client to "
            "resume it; then it is stopped. A page gone this long (its Gradio heartbeat ended, no event since) "
            "loses its Gradio session's state.", float),
    Setting("memory_budget_gb", ("CHAT_MEMORY_BUDGET_GB",), 0.0,
            "Memory the loaded engines may use together (CPU: GB of RAM; GPU: sum of gpu_memory_utilization). "
            "0 picks half the RAM on CPU and 1.0 on GPU. Loading past it unloads the least recently used idle engine.",
            float),
    Setting("ui_workers", ("CHAT_UI_WORKERS",), 0,
            "Processes that serve the web page, behind the one port (Caddy), all clients of the same engines; each "
            "browser stays with one. More serve more simultaneous readers. 0 picks 1 on a CPU engine (the engine needs "
            "the cores) and on a GPU one per 2 processor cores, at most 8.", int),
    Setting("votes_db", ("CHAT_VOTES_DB",), str(default_votes_path()),
            "SQLite file that keeps every Compare vote for the leaderboard; several app processes may share it."),
    Setting("verbose", ("CHAT_VERBOSE",), False,
            "Also print vLLM's own progress lines (about a hundred at each engine start) and the warnings of vLLM and "
            "torch known to be harmless (chat/logs.py); by default the console shows the other warnings and errors only.",
            bool),
    Setting("allow_untested_vllm", ("CHAT_ALLOW_UNTESTED_VLLM",), False,
            "Start on a vLLM this app has not run on (chat/engine_vllm.py lists those it has), with one warning. "
            "Off by default: such a vLLM stops the app at start with one sentence naming the tested ones.", bool),
    Setting("list_presets", (), False, "Print the presets and exit (at once: engine settings are checked by --check-presets).", bool),
    Setting("check_presets", (), False,
            "Validate every preset file, print each problem, exit non-zero when any is invalid.", bool),
)


def _env_default(setting: Setting) -> Any:
    for name in setting.env:
        raw = os.environ.get(name)
        if raw is None or raw == "":
            continue
        if setting.kind is bool:
            return raw.strip().lower() in ("1", "true", "yes", "on")
        try:
            return setting.kind(raw)
        except ValueError:
            raise SystemExit(f"{name}={raw!r} is not a valid {setting.kind.__name__}.") from None
    return setting.default


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="app.py",
        description="A streaming chat demo for vLLM with presets, sampling sliders and per-reply latency stats.",
        epilog="Each flag can also be set by the environment variable named in brackets.",
    )
    for setting in SETTINGS:
        env = f" [{', '.join(setting.env)}]" if setting.env else ""
        default = _env_default(setting)
        if setting.kind is bool:
            p.add_argument(setting.flag, action=argparse.BooleanOptionalAction if setting.env else "store_true",
                           default=default, help=setting.help + env)
        else:
            p.add_argument(setting.flag, type=setting.kind, default=default,
                           help=f"{setting.help} Default: {setting.default}.{env}")
    return p


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = parser().parse_args(argv)
    args.presets_dir = Path(args.presets_dir)
    return args


def ui_workers(args: argparse.Namespace, has_gpu: bool) -> int:
    """--ui-workers, with 0 resolved from this machine: each worker wants a core of its own beside the
    engine's processes, and a CPU engine computes on every core (a worker there only takes from it)."""
    if args.ui_workers > 0:
        return int(args.ui_workers)
    return max(1, min(8, (os.cpu_count() or 1) // 2)) if has_gpu else 1
