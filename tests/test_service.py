"""The one reply pipeline (`ChatService.reply`) on the stand-in engine (tests/stand_in.py): events,
Stop, refusals, policy. The reply stream and its stop on the real engine: tests/test_stream.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets

import pytest

from chat.errors import InputError, PresetError, SettingsError, Stopped
from chat.live import ReplyStore
from chat.service import Failed, Finished, ReplyRequest, Waiting, Writing
from chat.stats import Finish
from tests.stand_in_fixtures import engine, registry, service  # noqa: F401 - on the stand-in engine
from tests.test_stream import engine_idle

pytestmark = pytest.mark.engine


async def events_of(service, request):
    return [event async for event in service.reply(request)]


def ask(message="Say yes.", **fields):
    fields.setdefault("sampling", {"temperature": 0.0, "seed": 1, "max_tokens": 8})
    return ReplyRequest(message, **fields)


async def test_a_reply_is_writing_events_then_one_finished_with_stats(service, engine):
    events = await events_of(service, ask("Count from one to twenty.", sampling={"max_tokens": 12, "temperature": 0.0}))
    assert isinstance(events[-1], Finished)
    assert all(isinstance(e, Waiting | Writing) for e in events[:-1])
    writing = [e for e in events if isinstance(e, Writing)]
    assert writing and writing[0].reply is events[-1].reply
    reply = events[-1].reply
    assert reply.stats.finish is Finish.MAX_TOKENS and reply.stats.generated_tokens == 12
    assert reply.text.strip() and writing[-1].line.startswith(("Writing…", "Reading"))
    assert await engine_idle(engine)


@pytest.mark.parametrize(
    ("request_fields", "error", "sentence"),
    [
        ({"message": "   "}, InputError, "Type a message first."),
        ({"preset": "No such preset"}, PresetError, "No such preset"),
        ({"sampling": {"temperature": 9}}, SettingsError, "Temperature must be a number from 0 to 2; it was 9."),
        ({"system_prompt": "s" * 100_001}, InputError, "The system prompt is 100,001 characters"),
        ({"history": [{"role": "user", "content": "h" * 100_001}, {"role": "assistant", "content": "Yes."}]},
         InputError, "A message in this conversation is 100,001"),
    ],
)
async def test_what_a_person_can_get_wrong_ends_in_one_failed_event_with_the_sentence(service, request_fields, error, sentence):
    message = request_fields.pop("message", "Hello.")
    events = await events_of(service, ReplyRequest(message, **request_fields))
    assert len(events) == 1 and isinstance(events[0], Failed)
    assert isinstance(events[0].error, error) and sentence in events[0].error.message
    assert events[0].reply is None


async def test_stop_as_soon_as_the_reply_is_on_its_way_ends_it_as_stopped(service, engine):
    running = asyncio.create_task(events_of(service, ask("Tell me a long story.", stop_key="chat:early",
                                                         sampling={"max_tokens": 300})))
    while not service.stop("chat:early"):  # noqa: ASYNC110 - true once the pipeline holds the reply
        await asyncio.sleep(0)
    last = (await running)[-1]
    if isinstance(last, Failed):  # stopped before the engine took it
        assert isinstance(last.error, Stopped) and last.error.message == "Stopped by you before the reply started."
    else:
        assert last.reply.stats.finish is Finish.STOPPED_BY_USER and last.reply.stats.generated_tokens < 300
    assert not service.stop("chat:early")  # released at the end
    assert await engine_idle(engine)


async def test_stop_while_writing_keeps_the_text_and_stats_and_frees_the_engine(service, engine):
    request = ask("Tell me a very long story about dragons.", stop_key="chat:mid",
                  sampling={"max_tokens": 400, "temperature": 0.7})
    events = []
    async for event in service.reply(request):
        events.append(event)
        if isinstance(event, Writing) and event.reply.progress.tokens >= 3:
            assert service.stop("chat:mid")
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.reply.stats.finish is Finish.STOPPED_BY_USER
    assert 3 <= finished.reply.stats.generated_tokens < 400 and finished.reply.text
    assert await engine_idle(engine)


async def test_one_stop_key_stops_all_its_replies_and_no_other(service, engine):
    def long(key):
        return ask("Write a long poem about the sea.", stop_key=key, sampling={"max_tokens": 300, "temperature": 0.7})

    async def run(request, stop_when_writing=False):
        events = []
        async for event in service.reply(request):
            events.append(event)
            if stop_when_writing and isinstance(event, Writing) and event.reply.progress.tokens >= 2:
                service.stop("compare:s1")
        return events[-1]

    ends = await asyncio.gather(run(long("compare:s1"), stop_when_writing=True), run(long("compare:s1")),
                                run(ask("Say yes.", stop_key="chat:s1")))
    assert [e.reply.stats.finish for e in ends[:2]] == [Finish.STOPPED_BY_USER] * 2
    assert ends[2].reply.stats.finish in (Finish.FINISHED, Finish.MAX_TOKENS)
    assert await engine_idle(engine)


async def test_closing_the_events_like_a_closed_tab_aborts_the_reply(service, engine):
    request = ask("Tell me a very long story about ships.", sampling={"max_tokens": 400, "temperature": 0.7})
    async with contextlib.aclosing(service.reply(request)) as events:
        async for event in events:
            if isinstance(event, Writing):
                reply = event.reply
                break
    assert reply.stats.finish is Finish.DISCONNECTED
    assert await engine_idle(engine)


async def test_an_engine_a_reply_has_picked_is_in_use_before_its_stream_starts(service, registry, engine, monkeypatch):
    """The owner of shared engines asks each worker whether an engine is idle before putting it to
    sleep: a reply that has picked it but is still rendering its prompt (no stream yet) must count."""
    rendering, go_on = asyncio.Event(), asyncio.Event()
    render = type(engine).render

    async def slow_render(self, messages):
        rendering.set()
        await go_on.wait()
        return await render(self, messages)

    monkeypatch.setattr(type(engine), "render", slow_render)
    replying = asyncio.create_task(events_of(service, ask()))
    await asyncio.wait_for(rendering.wait(), timeout=60)
    assert engine.streams == 0 and engine.in_use
    assert not await registry.sharing.may_take(engine)
    go_on.set()
    assert isinstance((await replying)[-1], Finished)
    assert not engine.in_use and await registry.sharing.may_take(engine)

    async def broken_render(self, messages):
        raise RuntimeError("a bug")

    monkeypatch.setattr(type(engine), "render", broken_render)
    assert isinstance((await events_of(service, ask()))[-1], Failed)  # a reply that fails lets go of it too
    assert not engine.in_use


async def test_the_system_prompt_policy_is_the_presets_unless_one_is_given(service, engine, default_preset):
    async def first_message(**fields):
        events = await events_of(service, ask(**fields))
        return events[-1].reply.messages[0]

    assert await first_message() == {"role": "system", "content": default_preset.system_prompt}
    assert await first_message(system_prompt="Answer in French.") == {"role": "system", "content": "Answer in French."}
    assert (await first_message(system_prompt=""))["role"] == "user"


async def test_an_unexpected_error_is_logged_and_told_in_a_generic_sentence(service, caplog, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr("chat.service.to_model_messages", broken)
    with caplog.at_level(logging.ERROR, logger="chat.service"):
        events = await events_of(service, ask())
    assert isinstance(events[-1], Failed)
    assert events[-1].error.message == "Something went wrong on the server while writing this reply; please try again."
    assert "a bug" in caplog.text


# Closing a turn between its updates (Gradio's /cancel does, with aclose) ends its reply before the
# close returns. A generator that was only dropped is closed whenever the garbage collector gets to
# it, and its reply went on meanwhile: once, in a full run, an abandoned reply ran to its 400-token cap
# (tests/test_load.py). The front ends' generators are closed here as Gradio closes them.
LONG = "Write a long story about the sea."
PROGRAM_KNOBS = (0.7, 0.9, 0, 400, 1.1, -1)  # temperature, top_p, top_k, max_tokens, repetition_penalty, seed


async def close_once_writing(updates, writing, engine, streams: int = 1) -> None:
    """Read `updates` until `writing(update)`, with `streams` replies being written, then close them."""
    async for update in updates:
        if writing(update):
            break
    assert engine.streams == streams, "the replies are being written"
    await updates.aclose()
    assert engine.streams == 0 and engine.num_unfinished() == 0, "the replies ended with their turn's close"


def request_from(who: str):
    import gradio as gr

    return gr.Request(headers={"x-gradio-user": "api" if who == "program" else "page"}, session_hash=secrets.token_hex(8))


@pytest.mark.parametrize("who", ["program", "page"])
async def test_closing_a_chat_turn_between_updates_ends_its_reply_at_once(service, engine, who):
    import gradio as gr

    from chat.ui.chat_tab import replies, typed_turn

    request = request_from(who)
    if who == "program":  # the /chat API's function (and the ChatInterface's)
        updates = replies(service, ReplyStore())(LONG, [], request, service.default_preset, "", *PROGRAM_KNOBS)
        await close_once_writing(updates, lambda messages: any(m.content for m in messages), engine)
    else:  # the Chat tab's typed turn
        turn = typed_turn(service, ReplyStore(), gr.Chatbot(), lambda index, chat, saved: (index, saved))
        updates = turn(LONG, [], request, service.default_preset, "", *PROGRAM_KNOBS, "", None, [])
        await close_once_writing(updates, lambda update: len(update[1]) > 1, engine)


async def test_closing_a_comparison_between_updates_ends_every_column_at_once(service, engine):
    from chat.compare_service import CompareService, Wrote
    from tests.test_compare import CREATIVE, DETERMINISTIC  # two presets, one engine

    compare = CompareService(service)
    settings = [{"max_tokens": 400}, {"max_tokens": 400}]
    updates = compare.send(None, [CREATIVE, DETERMINISTIC], False, LONG, settings, secrets.token_hex(8))
    await close_once_writing(updates, lambda event: isinstance(event, Wrote) and engine.streams == 2, engine, streams=2)


@pytest.mark.parametrize("who", ["program", "page"])
async def test_closing_the_compare_tabs_turn_between_updates_ends_every_column_at_once(service, engine, who):
    """The tab's own Send (over the service tested above): closed as Gradio's /cancel closes it."""
    import gradio as gr

    from chat.compare import MAX_COLUMNS
    from chat.compare_service import CompareService
    from chat.ui.compare_tab import Board, CompareTab
    from tests.test_compare import CREATIVE, DETERMINISTIC

    with gr.Blocks() as demo, gr.Tabs() as tabs, gr.Tab("Compare"):
        tab = CompareTab(CompareService(service), ReplyStore(), demo, tabs)
    updates = tab.compare(request_from(who), Board(), [CREATIVE, DETERMINISTIC], False, LONG, *PROGRAM_KNOBS * MAX_COLUMNS)
    await close_once_writing(updates, lambda _: engine.streams == 2, engine, streams=2)


async def test_a_visitor_gets_a_share_of_replies_at_once_and_their_later_ones_wait_behind_others(service, engine):
    """--replies-per-visitor: one visitor's replies on their way at once, from every front end, are
    capped (one sentence beyond it, and a place again once one ends); another visitor is not touched;
    and a visitor's n-th reply at once asks vLLM for priority n, behind everyone's first."""
    from chat.errors import VisitorBusy
    from chat.service import ReplyEvent
    from tests.conftest import eventually

    service.per_visitor = 2
    long = {"sampling": {"max_tokens": 400, "temperature": 0.7}}
    firsts: dict[str, Writing] = {}

    async def read(request, keep: str | None = None) -> ReplyEvent:
        async for event in service.reply(request):
            if keep and isinstance(event, Writing) and keep not in firsts:
                firsts[keep] = event
        return event

    try:
        mine = [asyncio.create_task(read(ask("Tell me a long story.", visitor="voter:me", stop_key="mine", **long), f"mine{i}"))
                for i in range(2)]
        assert await eventually(lambda: len(firsts) == 2)
        refused = await read(ask(visitor="voter:me"))
        assert isinstance(refused, Failed) and isinstance(refused.error, VisitorBusy)
        assert refused.error.message.startswith("You have 2 replies being written already")
        assert isinstance(await read(ask(visitor="voter:someone-else")), Finished)  # not their share
        assert isinstance(await read(ask(visitor="")), Finished)  # nobody's (a capacity test's users)
        assert sorted(event.reply.priority for event in firsts.values()) == [0, 1]
        service.stop("mine")
        assert all(isinstance(event, Finished) for event in await asyncio.gather(*mine))
        assert isinstance(await read(ask(visitor="voter:me")), Finished)  # a place again
        assert not service.tallies.tallies._held  # every share given back
    finally:
        service.per_visitor = 0
    assert await engine_idle(engine)
