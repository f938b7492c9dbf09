"""The router's logic on its own: request heads, the forwarded client address, merged metrics."""

from __future__ import annotations

from chat.router import COOKIE, Backend, Head, Router, merge_metrics

RAW = (b"GET /gradio_api/queue/data?session_hash=abc HTTP/1.1\r\nHost: demo\r\n"
       b"Cookie: theme=dark; " + COOKIE.encode() + b"=1\r\nConnection: keep-alive\r\n"
       b"X-Forwarded-For: 127.0.0.1\r\n\r\n")


def test_a_head_gives_its_path_and_the_routers_cookie():
    head = Head.parse(RAW)
    assert head.path == "/gradio_api/queue/data"
    assert head.cookie(COOKIE) == "1" and head.cookie("theme") == "dark" and head.cookie("nothing") is None


def test_a_browser_cannot_claim_a_loopback_address_through_the_router():
    forwarded = Head.parse(RAW).forwarded("203.0.113.7").decode()
    assert forwarded.count("X-Forwarded-For") == 1 and "X-Forwarded-For: 203.0.113.7\r\n" in forwarded
    assert "Connection: close\r\n" in forwarded and "keep-alive" not in forwarded


def test_a_proxy_on_this_machine_keeps_the_address_it_forwarded():
    forwarded = Head.parse(RAW).forwarded("127.0.0.1").decode()
    assert "X-Forwarded-For: 127.0.0.1\r\n" in forwarded and forwarded.count("X-Forwarded-For") == 1


def test_websocket_upgrades_keep_their_connection_headers():
    raw = b"GET /chat HTTP/1.1\r\nHost: demo\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    forwarded = Head.parse(raw).forwarded("203.0.113.7").decode()
    assert "Connection: Upgrade\r\n" in forwarded and "Connection: close" not in forwarded


def test_the_cookie_picks_the_worker_and_newcomers_take_turns():
    backends = [Backend(0, port=1, state="serving"), Backend(1, port=2, state="serving"),
                Backend(2, port=None, state="restarting")]
    router = Router(lambda: backends)
    assert [router.choose(Head.parse(RAW)).index for _ in range(3)] == [1, 1, 1]
    newcomer = Head.parse(b"GET / HTTP/1.1\r\nHost: demo\r\n\r\n")
    assert sorted(router.choose(newcomer).index for _ in range(4)) == [0, 0, 1, 1]
    stale = Head.parse(b"GET / HTTP/1.1\r\nCookie: " + COOKIE.encode() + b"=2\r\n\r\n")
    assert router.choose(stale).index in (0, 1), "a worker that is restarting gets no requests"
    backends[1].state = "restarting"
    assert {router.choose(newcomer).index for _ in range(3)} == {0}


def test_merged_metrics_label_every_sample_and_describe_each_family_once():
    text = ('# HELP chat_replies_total Replies.\n# TYPE chat_replies_total counter\n'
            'chat_replies_total{preset="P",finish="finished"} 3.0\n'
            '# HELP up Up.\n# TYPE up gauge\nup 1.0\n')
    merged = merge_metrics({0: text, 1: text.replace("3.0", "4.0")})
    assert merged.splitlines() == [
        "# HELP chat_replies_total Replies.", "# TYPE chat_replies_total counter",
        'chat_replies_total{ui_worker="0",preset="P",finish="finished"} 3.0',
        'chat_replies_total{ui_worker="1",preset="P",finish="finished"} 4.0',
        "# HELP up Up.", "# TYPE up gauge", 'up{ui_worker="0"} 1.0', 'up{ui_worker="1"} 1.0',
    ]
