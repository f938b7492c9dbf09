"""The benchmark's servers as subprocesses: started in their own process group, waited for, stopped.

Each server gets its own session (process group) so that stopping it also ends the engine
processes it spawned, and nothing is left running when the benchmark ends or fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1",
           # A benchmark's client is one address with hundreds of readers: no visitor's share for it.
           "CHAT_REPLIES_PER_VISITOR": "0"}
    env.update(extra or {})
    return env


@dataclass
class Server:
    name: str
    argv: Sequence[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=base_env)
    process: subprocess.Popen | None = None
    lines: queue.Queue[str] | None = None  # stdout lines, when the protocol needs them

    def start(self, capture: bool = False) -> Server:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "w")  # noqa: SIM115 - open for the subprocess's lifetime
        self.process = subprocess.Popen(
            list(self.argv), cwd=ROOT, env=self.env, start_new_session=True,
            stdin=subprocess.PIPE if capture else subprocess.DEVNULL,
            stdout=subprocess.PIPE if capture else log, stderr=log, text=True, bufsize=1,
        )
        if capture:
            self.lines = queue.Queue()
            threading.Thread(target=self._pump, args=(log,), daemon=True).start()
        return self

    def _pump(self, log: Any) -> None:
        assert self.process is not None and self.process.stdout is not None and self.lines is not None
        for line in self.process.stdout:
            log.write(line)
            log.flush()
            # Anywhere in the line: vLLM's engine process writes to the same pipe and its prefix
            # ("(EngineCore pid=…) ") has been seen in front of a reply line, which then went unread.
            if (at := line.find("@@bench ")) >= 0:
                self.lines.put(line[at + len("@@bench "):])

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def wait_http(self, url: str, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} was not ready at {url} within {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(1)

    def send(self, op: dict[str, Any], timeout: float = 3600) -> dict[str, Any]:
        """One request/reply over the stdin/stdout protocol (bench/raw_engine.py)."""
        assert self.process is not None and self.process.stdin is not None and self.lines is not None
        self.process.stdin.write(json.dumps(op) + "\n")
        self.process.stdin.flush()
        return self.receive(timeout)

    def receive(self, timeout: float = 3600) -> dict[str, Any]:
        assert self.lines is not None
        deadline = time.monotonic() + timeout
        while True:
            try:
                return json.loads(self.lines.get(timeout=1))
            except queue.Empty:
                if not self.alive():
                    raise RuntimeError(f"{self.name} exited:\n{self.log_tail()}") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name} did not answer within {timeout:.0f} s") from None

    def stop(self, grace: float = 30) -> None:
        """SIGTERM the server, then its whole process group if anything is left."""
        if self.process is None:
            return
        group = self.process.pid  # start_new_session: the group id is the server's pid
        members = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == group]
        with contextlib.suppress(ProcessLookupError):
            if self.process.stdin:
                with contextlib.suppress(OSError):
                    self.process.stdin.close()
            self.process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace)
        _, alive = psutil.wait_procs([p for p in members if p.is_running()], timeout=5)
        if alive or self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def cpu_seconds(pids: Sequence[int]) -> float:
    """User+system CPU seconds of these processes themselves (not their children)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
    return total


def tree_cpu_seconds(pids: Sequence[int]) -> float:
    """User+system CPU seconds of these processes and all their descendants."""
    seen: set[int] = set()
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            for p in [root, *root.children(recursive=True)]:
                if p.pid in seen:
                    continue
                seen.add(p.pid)
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    total += t.user + t.system
    return total


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (all cores), for the noise estimate."""
    t = psutil.cpu_times()
    return t.user + t.system + getattr(t, "nice", 0) + getattr(t, "irq", 0) + getattr(t, "softirq", 0)


def python() -> str:
    return sys.executable
