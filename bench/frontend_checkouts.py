"""The apps the front-end benchmark measures: each a checkout's app.py (or a commit's, exported once),
served with the token source through bench/frontend_app.py.

    apps = [resolve_app("before=6d58522"), resolve_app("after=.")]
    start_apps(apps, args, logs, preset)   # each app gets its port, its server and its source log
"""

from __future__ import annotations

import argparse
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.procs import ROOT, Server, base_env, free_port, python

PRESET = ROOT / "bench" / "presets" / "frontend" / "token-source.yaml"
TREES = ROOT / "bench" / "results" / "trees"  # commits exported for --app-root REV, kept for later runs


@dataclass
class App:
    """One checkout's app.py, served with the token source."""

    label: str
    root: Path
    revision: str
    server: Server | None = None
    url: str = ""
    source_log: Path | None = None
    timeline_log: Path | None = None  # the app's moments of each page reply (bench/frontend_timeline.py)
    env: dict[str, str] = field(default_factory=dict)  # extra environment for its process (an experiment's switch)

    def source_records(self, since: float, offset: int) -> list[dict[str, Any]]:
        """The token source's records of requests that arrived at it since `since`."""
        assert self.source_log is not None
        with open(self.source_log) as f:
            f.seek(offset)
            records = [json.loads(line) for line in f if line.strip()]
        return [r for r in records if r["added"] >= since]

    def source_size(self) -> int:
        assert self.source_log is not None
        return self.source_log.stat().st_size if self.source_log.exists() else 0


def resolve_app(spec: str) -> App:
    """LABEL=PATH or LABEL=REV (a commit of this repository, exported once under bench/results/trees)."""
    label, _, where = spec.rpartition("=")
    path = Path(where)
    if path.is_dir():
        root = path.resolve()
        return App(label or root.name, root, _describe(root))
    sha = _git(ROOT, "rev-parse", "--verify", f"{where}^{{commit}}")
    root = TREES / sha[:12]
    if not (root / "app.py").exists():
        root.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha, "app.py", "chat", "presets"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return App(label or sha[:12], root, sha[:12])


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout.strip()


def _describe(root: Path) -> str:
    try:
        sha = _git(root, "rev-parse", "--short=12", "HEAD")
    except (subprocess.CalledProcessError, OSError):
        return "not a git checkout"
    dirty = _git(root, "status", "--porcelain", "--", "app.py", "chat")
    return sha + (" + uncommitted changes to app.py/chat" if dirty else "")


def start_apps(apps: list[App], args: argparse.Namespace, logs: Path, preset: dict[str, Any],
               source_tag: str = "") -> None:
    """Starts every app, then waits until each answers /healthz. With `source_tag` (a pattern that finds
    the benchmark's request number in a prompt) each also records its timeline (bench/frontend_timeline.py)."""
    for app in apps:
        port = free_port()
        app.url = f"http://127.0.0.1:{port}/"
        app.source_log = logs / f"source-{app.label}.jsonl"
        env = base_env({"BENCH_APP_ROOT": str(app.root), "BENCH_STEP_MS": str(args.step_ms),
                        "BENCH_SOURCE_LOG": str(app.source_log), "BENCH_APP_CPUS": args.app_cpus,
                        "BENCH_NICE": str(args.nice)})
        env.update(app.env)
        if source_tag:
            app.timeline_log = logs / f"timeline-{app.label}.jsonl"
            env.update(BENCH_SOURCE_TAG=source_tag, BENCH_TIMELINE_LOG=str(app.timeline_log))
        argv = [python(), str(ROOT / "bench" / "frontend_app.py"), "--port", str(port), "--presets-dir",
                str(PRESET.parent), "--preset", preset["name"], "--max-waiting", "8192", *args.app_arg]
        app.server = Server(f"app {app.label}", argv, logs / f"app-{app.label}.log", env=env).start()
    for app in apps:
        assert app.server is not None
        app.server.wait_http(app.url + "healthz", timeout=900)
        print(f"  {app.label}: ready ({app.root}, {app.revision})", flush=True)
