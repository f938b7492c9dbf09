"""How long the app takes to stop when its whole process group gets SIGTERM (as `docker stop` sends
it) mid-reply, and when each of its processes ends; optionally with connections a visitor leaves
open (an event stream, a heartbeat, an upload that stops sending) and with other work on the cores.

    python -m bench.stop_time --workers 2 --hold --repeats 5
    python -m bench.stop_time --workers 1 --burners 8
    python -m bench.stop_time --root ../other-checkout ...   # another checkout's app.py
    python -m bench.stop_time --app-arg=--verbose ...         # vLLM's own lines in the log too
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import socket
import sys
import time
from pathlib import Path

import psutil
from websockets.sync.client import connect

from bench.procs import Server

ROOT = Path(__file__).resolve().parent.parent
HELD = [b"GET /gradio_api/queue/data?session_hash=held HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n",
        b"GET /gradio_api/heartbeat/held HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /gradio_api/upload HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
        b"Content-Length: 100000\r\n\r\n--b\r\n"]


def burn() -> None:
    while True:
        pass


def ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # gone between the two looks
        return True


def one_stop(args: argparse.Namespace, log: Path) -> float:
    port = 7990 + os.getpid() % 500
    server = Server("app", [sys.executable, str(args.root / "app.py"), "--port", str(port), "--ui-workers", str(args.workers),
                            "--votes-db", str(log.with_suffix(".sqlite3")), *args.app_arg], log).start()
    app = server.process
    assert app is not None
    try:
        server.wait_http(f"http://127.0.0.1:{port}/healthz", 300)
        held = []
        for request in HELD if args.hold else []:
            held.append(socket.create_connection(("127.0.0.1", port)))
            held[-1].sendall(request)
        burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(args.burners)]
        for burner in burners:
            burner.start()
        children = {p.pid: p.name() for p in psutil.Process(app.pid).children(recursive=True)}
        ws = connect(f"ws://127.0.0.1:{port}/chat", open_timeout=30)
        ws.send(json.dumps({"type": "chat", "id": "long",
                            "messages": [{"role": "user", "content": "Count from 1 to 500, one number a line."}]}))
        while json.loads(ws.recv(timeout=120))["type"] != "delta":
            pass
        t0 = time.monotonic()
        os.killpg(app.pid, signal.SIGTERM)
        while app.poll() is None and time.monotonic() - t0 < 120:
            for pid in [pid for pid in children if ended(pid)]:
                print(f"  {time.monotonic() - t0:6.2f} s  {children.pop(pid)} ({pid}) ended", flush=True)
            time.sleep(0.05)
        took = time.monotonic() - t0
        for burner in burners:
            burner.terminate()
        for connection in held:
            connection.close()
        ws.close_socket()  # the server has gone: no closing handshake to wait for
        return took
    finally:
        if app.poll() is None:
            os.killpg(app.pid, signal.SIGKILL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="--ui-workers of the app")
    ap.add_argument("--hold", action="store_true", help="leave an event stream, a heartbeat and a stalled upload open")
    ap.add_argument("--burners", type=int, default=0, help="processes spinning on the cores meanwhile")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--app-arg", action="append", default=[], metavar="FLAG", help="an extra app.py flag (e.g. --verbose)")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose app.py runs (default: this one)")
    ap.add_argument("--log", type=Path, default=Path("/tmp/stop-time.log"), help="the app's output (the last run's)")
    args = ap.parse_args()
    times = []
    for n in range(args.repeats):
        times.append(one_stop(args, args.log))
        print(f"run {n + 1}: the app ended {times[-1]:.2f} s after SIGTERM to its group", flush=True)
    print(f"workers {args.workers}, held connections {args.hold}, burners {args.burners}: "
          + ", ".join(f"{t:.1f}" for t in times) + " s")


if __name__ == "__main__":
    main()
