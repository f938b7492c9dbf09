"""A flood from one address, and how /healthz answers everyone else meanwhile (issue 47, part 3).

Kinds of flood, each of `--count` connections from `--source` (an address of this machine):
- `stalled`: an upload's head declaring a body of `--declared` bytes, a few bytes of it, then nothing;
- `idle`: one request answered on each connection, then the connection kept open and silent.

While the flood holds, a probe from `--probe-source` asks /healthz every `--every-ms`, each on a new
connection, and the report gives the slowest answer, the failures and how many of the flood's
connections the server had closed, second by second:

    ulimit -n 1024; python app.py --host 0.0.0.0 --port 7860 &
    python -m bench.flood http://127.0.0.1:7860/ --source 192.0.2.2 --kind stalled --count 1000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import statistics
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class FloodReport:
    kind: str
    count: int
    opened: int = 0  # connections the server accepted (the head went out)
    refused: int = 0  # connections that failed to open or were answered at once (a 4xx/5xx or a close)
    closed_by_server: list[float] = field(default_factory=list)  # seconds after the start
    answers: dict[str, int] = field(default_factory=dict)  # status line -> count, of what the server said
    probes: list[float | None] = field(default_factory=list)  # /healthz latencies in s (None: failed)

    def summary(self) -> dict[str, object]:
        answered = [p for p in self.probes if p is not None]
        return {
            "kind": self.kind, "count": self.count, "opened": self.opened, "refused_at_once": self.refused,
            "closed_by_server": len(self.closed_by_server),
            "closed_within_s": round(max(self.closed_by_server), 1) if self.closed_by_server else None,
            "answers": self.answers,
            "probes": len(self.probes), "probe_failures": len(self.probes) - len(answered),
            "probe_ms_p50": round(statistics.median(answered) * 1000, 1) if answered else None,
            "probe_ms_max": round(max(answered) * 1000, 1) if answered else None,
            "probes_over_100ms": sum(1 for p in answered if p > 0.1),
        }


async def open_from(host: str, port: int, source: str | None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(host, port, local_addr=(source, 0) if source else None)


def stalled_head(host: str, path: str, declared: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: multipart/form-data; boundary=b\r\n"
            f"Content-Length: {declared}\r\n\r\n--b\r\n").encode()


def idle_request(host: str, path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: keep-alive\r\n\r\n".encode()


async def one(report: FloodReport, args: argparse.Namespace, started: float, hold: asyncio.Event) -> None:
    url = urlsplit(args.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    try:
        reader, writer = await asyncio.wait_for(open_from(host, port, args.source), 10)
    except (TimeoutError, OSError):
        report.refused += 1
        return
    try:
        if args.kind == "stalled":
            writer.write(stalled_head(url.netloc, args.path or "/gradio_api/upload", args.declared))
        else:
            writer.write(idle_request(url.netloc, args.path or "/healthz"))
        await writer.drain()
        report.opened += 1
        if args.kind == "idle":  # read the answer, then keep the connection silent
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            status = head.split(b"\r\n", 1)[0].decode(errors="replace")
            report.answers[status] = report.answers.get(status, 0) + 1
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
        # Now silent: wait for the server to close, or for the flood's end.
        reading = asyncio.ensure_future(reader.read(65536))
        ending = asyncio.ensure_future(hold.wait())
        done, _ = await asyncio.wait({reading, ending}, return_when=asyncio.FIRST_COMPLETED)
        if reading in done:
            data = b""
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                data = reading.result()
                while more := await asyncio.wait_for(reader.read(65536), 5):
                    data += more
            if data:
                status = data.split(b"\r\n", 1)[0].decode(errors="replace")
                report.answers[status] = report.answers.get(status, 0) + 1
            report.closed_by_server.append(time.monotonic() - started)
        reading.cancel()
        ending.cancel()
    except (TimeoutError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        report.closed_by_server.append(time.monotonic() - started)
    finally:
        writer.close()


async def probe(report: FloodReport, args: argparse.Namespace, until: float) -> None:
    url = urlsplit(args.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    while time.monotonic() < until:
        began = time.monotonic()
        try:
            reader, writer = await asyncio.wait_for(open_from(host, port, args.probe_source), 5)
            writer.write(f"GET /healthz HTTP/1.1\r\nHost: {url.netloc}\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            report.probes.append(time.monotonic() - began if b" 200 " in head.split(b"\r\n", 1)[0] else None)
            writer.close()
        except (TimeoutError, OSError, asyncio.IncompleteReadError):
            report.probes.append(None)
        await asyncio.sleep(max(0.0, args.every_ms / 1000 - (time.monotonic() - began)))


async def flood(args: argparse.Namespace) -> FloodReport:
    report = FloodReport(args.kind, args.count)
    hold = asyncio.Event()
    started = time.monotonic()
    probing = asyncio.ensure_future(probe(report, args, started + args.seconds))
    tasks = []
    for i in range(args.count):
        tasks.append(asyncio.ensure_future(one(report, args, started, hold)))
        if i % 50 == 49:
            await asyncio.sleep(0.01)  # a burst, not one SYN storm the kernel's backlog drops
    await probing
    hold.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--kind", choices=("stalled", "idle"), default="stalled")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--source", help="the flood's source address (default: the kernel's choice)")
    parser.add_argument("--probe-source", help="the probe's source address")
    parser.add_argument("--path", help="default: /gradio_api/upload (stalled), /healthz (idle)")
    parser.add_argument("--declared", type=int, default=1_000_000_000, help="a stalled upload's Content-Length")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long to hold the flood and probe")
    parser.add_argument("--every-ms", type=float, default=100.0)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, args.count + 256)), hard))
    print(json.dumps(asyncio.run(flood(args)).summary()))


if __name__ == "__main__":
    main()
