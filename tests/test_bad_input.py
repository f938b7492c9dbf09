"""Hostile and mistaken input through the real HTTP API: one plain sentence each, and the app keeps serving.

Preset files have their own hostile cases in test_presets.py; a very long history, which the
HTTP API keeps in server state, is in test_stream.py.
"""

from __future__ import annotations

import re

import pytest

from chat.stats import SUMMARY

PRESET = "SmolLM2 135M (CPU)"
OK = re.compile(r"📊 " + SUMMARY.pattern)
DEFAULTS = {"temperature": 0.0, "top_p": 0.9, "top_k": 0, "max_tokens": 4, "repetition_penalty": 1.1, "seed": 1}


def ask(client, message, system_prompt="You are a helpful assistant.", preset=PRESET, **sampling):
    values = {**DEFAULTS, **sampling}
    return client.predict(message, preset, system_prompt, *values.values(), api_name="/chat")


def title(messages):
    return messages[-1]["metadata"]["title"]


def plain(sentence: str) -> re.Pattern:
    return re.compile(re.escape("⚠️ " + sentence))


CASES = [
    # (case id, message, sampling / system prompt overrides, expected title)
    ("empty", "", {}, plain("Type a message first.")),
    ("whitespace only", " \n\t  ", {}, plain("Type a message first.")),
    ("a megabyte", "a" * 1_000_000, {}, plain("Your message is 1,000,000 characters; the limit is 100,000. Shorten it and send it again.")),
    ("just over the limit", "b" * 100_001, {}, plain("Your message is 100,001 characters; the limit is 100,000. Shorten it and send it again.")),
    ("over the context", "word " * 3000, {},
     re.compile(r"⚠️ Your conversation is [\d,]+ tokens; this model accepts 2,048\. Start a new chat or shorten your message\.")),
    ("a huge system prompt", "Hi", {"system_prompt": "x" * 200_000},
     plain("The system prompt is 200,000 characters; the limit is 100,000. Shorten it and send your message again.")),
    ("control characters", "\x00\x01\x07hello\x1b[31m red\x7f", {}, OK),
    ("right-to-left text", "مرحبا، كيف حالك اليوم؟", {}, OK),
    ("emoji", "😀🎉👍🏽 what do these mean?", {}, OK),
    ("script injection", "<script>alert(1)</script><img src=x onerror=alert(2)>", {}, OK),
    ("a markdown image", "![tracker](http://evil.example/pixel.png) describe this", {}, OK),
    ("temperature too high", "Hi", {"temperature": 9}, plain("Temperature must be a number from 0 to 2; it was 9.")),
    ("temperature negative", "Hi", {"temperature": -1}, plain("Temperature must be a number from 0 to 2; it was -1.")),
    ("temperature as text", "Hi", {"temperature": "hot"}, plain("Temperature must be a number from 0 to 2; it was 'hot'.")),
    ("temperature as a list", "Hi", {"temperature": [1]}, plain("Temperature must be a number from 0 to 2; it was [1].")),
    ("temperature missing", "Hi", {"temperature": None}, OK),
    ("top-p zero", "Hi", {"top_p": 0}, plain("Top-p must be a number from 0.05 to 1; it was 0.")),
    ("top-p above one", "Hi", {"top_p": 1.5}, plain("Top-p must be a number from 0.05 to 1; it was 1.5.")),
    ("top-k negative", "Hi", {"top_k": -5}, plain("Top-k must be a whole number from 0 to 200; it was -5.")),
    ("top-k fractional", "Hi", {"top_k": 3.7}, plain("Top-k must be a whole number from 0 to 200; it was 3.7.")),
    ("max tokens zero", "Hi", {"max_tokens": 0}, plain("Max new tokens must be a whole number from 1 to 1024; it was 0.")),
    ("max tokens above the preset's cap", "Hi", {"max_tokens": 5000},
     plain("Max new tokens must be a whole number from 1 to 1024; it was 5000.")),
    ("max tokens as text", "Hi", {"max_tokens": "many"}, plain("Max new tokens must be a whole number from 1 to 1024; it was 'many'.")),
    ("repetition penalty zero", "Hi", {"repetition_penalty": 0}, plain("Repetition penalty must be a number from 1 to 2; it was 0.")),
    ("repetition penalty huge", "Hi", {"repetition_penalty": 50}, plain("Repetition penalty must be a number from 1 to 2; it was 50.")),
    ("seed below -1", "Hi", {"seed": -7}, plain("Seed must be a whole number from -1 to 2147483647; it was -7.")),
    ("seed too large", "Hi", {"seed": 10**12}, plain("Seed must be a whole number from -1 to 2147483647; it was 1000000000000.")),
    ("seed as an object", "Hi", {"seed": {"a": 1}}, plain("Seed must be a whole number from -1 to 2147483647; it was {'a': 1}.")),
]


@pytest.mark.parametrize(("message", "overrides", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_input_gets_one_plain_sentence_and_the_app_keeps_serving(client, message, overrides, expected):
    overrides = dict(overrides)
    system_prompt = overrides.pop("system_prompt", "You are a helpful assistant.")
    messages = ask(client, message, system_prompt=system_prompt, **overrides)
    shown = title(messages)
    assert expected.fullmatch(shown), shown
    assert "Traceback" not in str(messages) and "Error" not in shown
    assert OK.fullmatch(title(ask(client, "Say OK.", max_tokens=1)))


@pytest.mark.parametrize("preset", ["No such preset", "../../etc/passwd", "/root/.cache"])
def test_presets_are_picked_by_name_only(client, preset):
    shown = title(ask(client, "Hi", preset=preset))
    assert shown.startswith(f"⚠️ There is no preset named {preset!r}; the presets are: "), shown
    assert OK.fullmatch(title(ask(client, "Say OK.", max_tokens=1)))


def raw_chat(url: str, body: str) -> list[dict]:
    """Call /chat through Gradio's REST API with a JSON body written by hand, so it can carry
    what a normal JSON encoder refuses to produce (like an escaped lone surrogate)."""
    import json

    import httpx

    post = httpx.post(url + "gradio_api/call/chat", content=body.encode(), headers={"Content-Type": "application/json"}, timeout=30)
    post.raise_for_status()
    event_id = post.json()["event_id"]
    with httpx.stream("GET", f"{url}gradio_api/call/chat/{event_id}", timeout=60) as response:
        event = None
        for line in response.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event == "complete":
                return json.loads(line[5:])[0]
    raise AssertionError("no complete event")


@pytest.mark.parametrize(
    "body",
    [
        '{"data": ["hello \\ud800 world", "SmolLM2 135M (CPU)", "", 0, 0.9, 0, 4, 1.1, 1]}',
        '{"data": ["Hi", "SmolLM2 135M (CPU)", "Be brief \\udfff.", 0, 0.9, 0, 4, 1.1, 1]}',
    ],
    ids=["in the message", "in the system prompt"],
)
def test_a_lone_surrogate_is_replaced_not_fatal(app_server, client, body):
    assert "\\ud800" in body or "\\udfff" in body
    assert OK.fullmatch(title(raw_chat(app_server.url, body)))
    assert OK.fullmatch(title(ask(client, "Say OK.", max_tokens=1)))


@pytest.mark.parametrize(
    "body",
    ['{"data": ["Hi", "SmolLM2 135M (CPU)"]}', '{"data": []}', '{"data": ["Hi", "SmolLM2 135M (CPU)", {"x": [1]}, "warm"]}'],
    ids=["too few inputs", "no inputs", "wrong types"],
)
def test_an_event_called_with_inputs_that_do_not_fit_gets_a_sentence_not_a_traceback(app_server, client, body):
    import httpx

    from chat.ui.gradio_errors import BAD_INPUTS

    post = httpx.post(app_server.url + "gradio_api/call/chat", content=body.encode(),
                      headers={"Content-Type": "application/json"}, timeout=30)
    post.raise_for_status()
    with httpx.stream("GET", f"{app_server.url}gradio_api/call/chat/{post.json()['event_id']}", timeout=60) as response:
        lines = list(response.iter_lines())
    assert "event: error" in lines and BAD_INPUTS in "\n".join(lines), lines
    assert OK.fullmatch(title(ask(client, "Say OK.", max_tokens=1)))  # and the app keeps serving


@pytest.mark.unit
def test_a_markdown_image_in_a_reply_becomes_a_link_the_browser_does_not_fetch():
    from chat.ui.messages import shown_text

    assert shown_text("see ![x](http://evil.example/p.png) now") == "see [x](http://evil.example/p.png) now"
