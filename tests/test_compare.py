"""Comparing presets: the record, blind labels, votes, summary, exports and links (pure logic),
then two presets streaming at once through the running app (real engine, over HTTP)."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import random
import threading
import time
import types
from urllib.parse import parse_qsl, urlsplit

import pytest

from chat.compare import ALL_BAD, HIDDEN, TIE, Comparison
from chat.compare_report import summarize, to_csv, to_json, to_markdown, write_exports
from chat.errors import InputError, PresetError, SettingsError
from chat.history import text_of
from chat.presets import load_presets
from chat.share_link import decode_link, encode_link
from chat.stats import REPLIED, SUMMARY, Finish, ReplyStats, percentile
from tests.conftest import api_client

CREATIVE, DETERMINISTIC = "SmolLM2 135M (CPU)", "SmolLM2 135M (CPU, deterministic)"


@pytest.fixture(scope="module")
def catalog():
    return load_presets(check_engine=False)


@pytest.fixture
def presets(catalog):
    return [catalog.get(CREATIVE), catalog.get(DETERMINISTIC)]


def stats_for(preset: str, sampling, first_token_s=0.2, tokens=41, decode_s=2.0) -> ReplyStats:
    return ReplyStats(
        preset=preset, sampling=sampling, prompt_tokens=30, cached_prompt_tokens=0, generated_tokens=tokens,
        first_token_s=first_token_s, total_s=first_token_s + decode_s, queue_s=0.0, prefill_s=0.1, decode_s=decode_s,
        finish=Finish.MAX_TOKENS, context_limit=2048,
    )


def answer(comparison: Comparison, prompt: str, texts=None, first_token_s=(0.2, 0.3)) -> None:
    """One turn in which every column finished, with made-up stats."""
    columns = comparison.columns
    defaults = [p.sampling.defaults for p in (load_presets(check_engine=False).get(c.preset) for c in columns)]
    turn = comparison.add_turn(prompt, defaults)
    for reply in turn.replies:
        column = columns[reply.column]
        reply.text = (texts or {}).get(column.preset, f"{column.label} says hi to: {prompt}")
        reply.stats = stats_for(column.preset, reply.sampling, first_token_s=first_token_s[reply.column])
        reply.finished = True


def test_summary_gives_median_and_95th_percentile_from_known_stats(presets):
    comparison = Comparison.start(presets)
    for first_token in (0.5, 0.1, 0.4, 0.2, 0.3):  # A's times; B's are ten times larger
        answer(comparison, "Hi", first_token_s=(first_token, first_token * 10))
    comparison.turns[0].replies[1].stats = stats_for(DETERMINISTIC, comparison.turns[0].replies[1].sampling,
                                                     first_token_s=5.0, tokens=11, decode_s=1.0)  # 10 tokens/s
    comparison.vote("A")
    a, b = summarize(comparison)
    assert (a.label, a.preset, a.replies, a.votes_won, b.votes_won) == ("A", CREATIVE, 5, 1, 0)
    assert a.first_token_median_s == pytest.approx(0.3)
    assert a.first_token_p95_s == pytest.approx(0.48)  # between the 4th and 5th of 5, 80 % of the way
    assert a.tokens_per_s_median == pytest.approx(20.0) and a.length_median_tokens == 41
    assert b.first_token_median_s == pytest.approx(3.0) and b.first_token_p95_s == pytest.approx(4.8)
    assert b.tokens_per_s_median == pytest.approx(20.0) and b.length_median_tokens == 41


def test_percentile_edges():
    assert percentile([], 95) is None
    assert percentile([7.0], 95) == 7.0
    assert percentile([1.0, 2.0], 50) == 1.5
    assert percentile([3.0, 1.0, 2.0], 100) == 3.0


def test_blind_columns_hide_names_everywhere_until_the_first_vote(presets):
    comparison = Comparison.start(presets, blind=True, rng=random.Random(3))
    answer(comparison, "Name a colour.")
    assert [comparison.title(i) for i in range(2)] == ["A", "B"]
    assert comparison.preset_of(0) == comparison.preset_of(1) == HIDDEN
    assert [row.preset for row in summarize(comparison)] == [HIDDEN, HIDDEN]
    for export in (to_json(comparison), to_csv(comparison), to_markdown(comparison)):
        assert "SmolLM2" not in export and "embedded" not in export  # neither names nor models
    assert {r["sampling"] for turn in json.loads(to_json(comparison))["turns"] for r in turn["replies"]} == {HIDDEN}
    assert {row["temperature"] for row in csv.DictReader(io.StringIO(to_csv(comparison)))} == {""}
    assert "Settings: hidden until you vote" in to_markdown(comparison) and "Temperature" not in to_markdown(comparison)
    # Nor how fast or how long each column's reply was: the summary, the exports and the page say nothing.
    assert [(r.replies, r.first_token_median_s, r.tokens_per_s_median, r.length_median_tokens)
            for r in summarize(comparison)] == [(1, None, None, None), (1, None, None, None)]
    assert {r["stats"] is None for turn in json.loads(to_json(comparison))["turns"] for r in turn["replies"]} == {True}
    assert {row["generated_tokens"] + row["first_token_s"] for row in csv.DictReader(io.StringIO(to_csv(comparison)))} == {""}
    assert not SUMMARY.search(to_markdown(comparison)) and "Stats are shown after you vote" in to_markdown(comparison)
    vote = comparison.vote("B")
    assert vote.blind and comparison.revealed
    assert comparison.title(1) == f"B · {comparison.columns[1].preset}"
    assert {row.preset for row in summarize(comparison)} == {CREATIVE, DETERMINISTIC}
    assert all(r.first_token_median_s is not None for r in summarize(comparison))
    answer(comparison, "And another?")
    assert not comparison.vote(TIE).blind  # the names were known by then, and the record says so


def test_blind_mode_shuffles_which_preset_is_which_column(presets):
    orders = {tuple(c.preset for c in Comparison.start(presets, blind=True, rng=random.Random(seed)).columns)
              for seed in range(20)}
    assert len(orders) == 2
    assert [c.preset for c in Comparison.start(presets).columns] == [CREATIVE, DETERMINISTIC]  # not blind: as picked


def test_votes_are_per_turn_and_refused_plainly(presets, catalog):
    comparison = Comparison.start(presets)
    with pytest.raises(InputError, match="Send a prompt first"):
        comparison.vote("A")
    comparison.add_turn("Hi", [p.sampling.defaults for p in presets])
    with pytest.raises(InputError, match="Wait until every column has finished"):
        comparison.vote("A")
    for reply in comparison.turns[0].replies:
        reply.finished = True
    with pytest.raises(InputError, match="not one of the choices"):
        comparison.vote("C")
    comparison.vote(ALL_BAD)
    with pytest.raises(InputError, match="voted on turn 1"):
        comparison.vote("A")
    assert [text for text, _ in comparison.vote_options()] == ["A is better", "B is better", "Tie", "Both bad"]
    three = Comparison.start([*presets, catalog.get("qwen2.5-7b-chat")])
    assert [text for text, _ in three.vote_options()] == ["A is best", "B is best", "C is best", "Tie", "All bad"]
    with pytest.raises(InputError, match="two to four"):
        Comparison.start(presets[:1])


def test_each_column_continues_its_own_conversation_and_reruns_stay_out_of_it(presets):
    comparison = Comparison.start(presets)
    answer(comparison, "Name a fruit.", texts={CREATIVE: "Mango.", DETERMINISTIC: "Apple."})
    rerun = comparison.add_rerun(0, 1)
    rerun.text, rerun.finished = "Pear.", True
    assert (rerun.attempt, rerun.sampling) == (2, comparison.turns[0].reply(1).sampling)
    comparison.add_turn("Why?", [p.sampling.defaults for p in presets])
    assert [m["content"] for m in comparison.messages(1, 1)][1:] == ["Name a fruit.", "Apple.", "Why?"]
    assert [m["content"] for m in comparison.messages(0, 1)][1:] == ["Name a fruit.", "Mango.", "Why?"]
    assert comparison.messages(0, 1)[0]["role"] == "system"
    comparison.turns[0].reply(0).text = ""  # a reply that failed: its prompt was never answered
    assert [m["content"] for m in comparison.messages(0, 1)][1:] == ["Why?"]


def test_exports_carry_every_reply_stat_setting_and_vote(presets, tmp_path):
    comparison = Comparison.start(presets)
    answer(comparison, "Say hi.", texts={CREATIVE: "Hi there!\nHow are you?", DETERMINISTIC: "=1+1"})
    comparison.vote("B")
    answer(comparison, "Again.")
    rerun = comparison.add_rerun(1, 0)
    rerun.error, rerun.finished = "The demo is busy, try again in a moment.", True
    replies = [reply for turn in comparison.turns for reply in turn.replies]

    data = json.loads(to_json(comparison))
    assert [c["preset"] for c in data["columns"]] == [CREATIVE, DETERMINISTIC]
    assert data["columns"][0]["engine"]["max_model_len"] == 2048
    exported = [r for turn in data["turns"] for r in turn["replies"]]
    assert [r["text"] for r in exported] == [r.text for r in replies]
    assert exported[1]["sampling"] == presets[1].sampling.defaults.as_dict()
    assert exported[0]["stats"]["first_token_s"] == 0.2 and exported[0]["stats"]["tokens_per_s"] == 20.0
    assert exported[-1] | {"stats": None} == exported[-1] and exported[-1]["error"].startswith("The demo is busy")
    assert data["turns"][0]["vote"] == {"choice": "B", "text": "B is better", "cast_blind": False}
    assert data["summary"][1]["votes_won"] == 1

    rows = list(csv.DictReader(io.StringIO(to_csv(comparison))))
    assert len(rows) == len(replies) == 5
    assert [row["text"] for row in rows][:2] == ["Hi there!\nHow are you?", "'=1+1"]  # no formula for spreadsheets
    assert rows[0]["preset"] == CREATIVE and rows[0]["temperature"] == "0.7" and rows[1]["seed"] == "1234"
    assert rows[0]["first_token_s"] == "0.2" and rows[0]["generated_tokens"] == "41" and rows[0]["finish"] == "max_tokens"
    assert [(row["vote"], row["won"]) for row in rows[:2]] == [("B is better", "False"), ("B is better", "True")]
    assert rows[-1]["attempt"] == "2" and rows[-1]["error"].startswith("The demo is busy") and rows[-1]["first_token_s"] == ""

    markdown = to_markdown(comparison)
    for expected in ("Hi there!", "How are you?", "=1+1", "**Vote:** B is better", "### A · SmolLM2 135M (CPU) (rerun 2)",
                     "replied after 0.20 s", "Temperature 0.7", "| B | SmolLM2 135M (CPU, deterministic) | 2 | 300 ms |"):
        assert expected in markdown

    paths = write_exports(comparison, tmp_path / "out")
    assert sorted(paths) == ["csv", "json", "md"] and all(path.parent == tmp_path / "out" for path in paths.values())
    assert json.loads(paths["json"].read_text())["turns"][0]["prompt"] == "Say hi."


def test_a_link_round_trips_presets_settings_prompt_and_blind(presets, catalog):
    creative = presets[0].sampling.resolve({"temperature": 0.25, "max_tokens": 64})
    deterministic = presets[1].sampling.defaults
    link = encode_link(presets, [creative, deterministic], "Compare: a haiku, please & thanks?", blind=True)
    assert "s1=temperature:0.25,max_tokens:64" in link and "s2" not in link  # only what differs from the preset
    setup = decode_link(parse_qsl(urlsplit(link).query), catalog.get)
    assert setup.presets == (CREATIVE, DETERMINISTIC)
    assert setup.sampling == (creative, deterministic)
    assert (setup.prompt, setup.blind) == ("Compare: a haiku, please & thanks?", True)
    assert decode_link(parse_qsl("__theme=dark"), catalog.get) is None  # not a comparison link


@pytest.mark.parametrize(
    ("query", "error", "message"),
    [
        ("p=Nope&p=SmolLM2 135M (CPU)", PresetError, "There is no preset named 'Nope'"),
        ("p=SmolLM2 135M (CPU)&p=SmolLM2 135M (CPU, deterministic)&s1=temperature:9", SettingsError,
         "SmolLM2 135M (CPU): Temperature must be a number from 0 to 2; it was 9."),
        ("p=SmolLM2 135M (CPU)&p=SmolLM2 135M (CPU, deterministic)&s2=max_tokens:5000", SettingsError,
         "Max new tokens must be a whole number from 1 to 1024; it was 5000."),
        ("p=SmolLM2 135M (CPU)&p=SmolLM2 135M (CPU, deterministic)&s1=top_p:abc", SettingsError, "it was 'abc'"),
        ("p=SmolLM2 135M (CPU)&p=SmolLM2 135M (CPU, deterministic)&s1=colour:red", SettingsError, "Unknown setting 'colour'"),
        ("p=SmolLM2 135M (CPU)&p=SmolLM2 135M (CPU, deterministic)&s1=temperature", SettingsError, "write name:value"),
        ("p=SmolLM2 135M (CPU)&p=SmolLM2 135M (CPU, deterministic)&s3=seed:1", SettingsError, "names only 2 presets"),
        ("p=SmolLM2 135M (CPU)", InputError, "two to four presets; this one names 1"),
        ("p=SmolLM2 135M (CPU)&p=SmolLM2 135M (CPU)", InputError, "names a preset twice"),
    ],
)
def test_a_link_with_unknown_presets_or_bad_values_is_refused_plainly(catalog, query, error, message):
    with pytest.raises(error) as caught:
        decode_link(parse_qsl(query), catalog.get)
    assert message in caught.value.message


def test_programs_keep_one_comparison_per_session_and_the_oldest_sessions_are_forgotten():
    from chat.compare_service import CompareService
    from chat.ui.compare_api import CompareApi

    api = CompareApi(CompareService(service=None), store=None, max_sessions=2)  # the sessions' bookkeeping only
    first = api.board("a")
    assert api.board("a") is first
    api.board("b")
    api.board("a")  # used again: now the most recent
    api.board("c")
    assert list(api.boards) == ["a", "c"] and api.board("a") is first
    with api.comparisons._turn_of("c"):  # a comparison being written is kept however old
        api.board("d")
    assert list(api.boards) == ["c", "d"]


class ScriptedReplies:
    """The seam CompareService writes through (`ChatService`'s catalog, pacer and `reply`), with each
    reply a script of words at a fixed pace: the fan-out's timing, without an engine."""

    def __init__(self, catalog, every_s: float, words: int) -> None:
        self.catalog, self.default_preset, self.has_gpu = catalog, CREATIVE, False
        self.pacer = types.SimpleNamespace(interval=lambda: 0.2)
        self.every_s, self.words = every_s, words

    async def reply(self, request):
        from chat.service import Finished, Writing

        reply = types.SimpleNamespace(text="", stats=None, notice=None,
                                      progress=types.SimpleNamespace(line=lambda now: "Writing…"))
        for _ in range(self.words):
            await asyncio.sleep(self.every_s)
            reply.text += "word "
            yield Writing(reply, "Writing…")
        yield Finished(reply)


async def test_a_turn_hands_on_each_column_s_text_at_once_and_coalesces_the_redraws(catalog):
    from chat.compare_service import Begun, CompareService, Ended, Redraw, Wrote

    compare = CompareService(ScriptedReplies(catalog, every_s=0.02, words=20))
    events = [event async for event in compare.send(None, [CREATIVE, DETERMINISTIC], False, "Hi", [{}, {}], "s")]
    assert isinstance(events[0], Begun) and len(events[0].jobs) == 2 and isinstance(events[-1], Ended)
    wrote = [event for event in events if isinstance(event, Wrote)]
    redraws = [event for event in events if isinstance(event, Redraw)]
    assert len(wrote) == 40  # every piece of every column, for a page's live text
    assert 2 <= len(redraws) < len(wrote) / 2  # one redraw per 0.2 s for both columns, not one per piece
    assert [entry.text for entry in events[0].comparison.turns[0].replies] == ["word " * 20] * 2
    assert not compare.writing  # the session's turn is free again


async def test_a_session_s_next_turn_may_start_once_its_last_column_has_ended(catalog):
    """A page draws a turn's end after `Ended`: a Send pressed then is taken, not refused as Busy, and
    the first turn's closing afterwards does not free the session under the next one."""
    from chat.compare_service import Begun, Busy, CompareService, Ended

    compare = CompareService(ScriptedReplies(catalog, every_s=0.01, words=3))
    picked = [CREATIVE, DETERMINISTIC]
    first = compare.send(None, picked, False, "Hi", [{}, {}], "s")
    begun = await anext(first)
    assert isinstance(begun, Begun)
    with pytest.raises(Busy) as refused:  # while its columns are written
        await anext(compare.send(begun.comparison, picked, False, "Too soon", [{}, {}], "s"))
    assert not refused.value.again
    with pytest.raises(Busy) as refused:  # Send clicked twice: the page need not say anything
        await anext(compare.send(begun.comparison, picked, False, " Hi", [{}, {}], "s"))
    assert refused.value.again
    while not isinstance(await anext(first), Ended):
        pass
    second = compare.send(begun.comparison, picked, False, "Again", [{}, {}], "s")  # the first waits at its end
    assert isinstance(await anext(second), Begun)
    await first.aclose()
    with pytest.raises(Busy):
        await anext(compare.send(begun.comparison, picked, False, "Third", [{}, {}], "s"))
    await second.aclose()
    assert not compare.writing


# --- through the running app ------------------------------------------------------------------


def compare_inputs(prompt: str, max_tokens: int) -> list:
    """The /compare endpoint's inputs: presets, blind, prompt, then each preset's settings by name."""
    settings = {"temperature": 0.0, "top_p": 0.9, "top_k": 0, "max_tokens": max_tokens, "repetition_penalty": 1.1, "seed": 1}
    return [[CREATIVE, DETERMINISTIC], False, prompt, [settings, settings]]


def column_chats(update: dict) -> list[list[dict]]:
    return [column["messages"] for column in update["columns"]]


def test_two_presets_on_one_engine_stream_at_the_same_time(client, app_server):
    """Both columns are written by one event, concurrently: each column's text grows while the other's does."""
    growth: dict[int, list[float]] = {0: [], 1: []}
    seen = {0: "", 1: ""}
    sent = time.monotonic()
    job = client.submit(*compare_inputs("Write a short poem about the sea.", 80), api_name="/compare")
    chatbots = None
    for update in job:
        chatbots = column_chats(update)
        now = time.monotonic()
        for column, messages in enumerate(chatbots[:2]):
            text = "".join(text_of(m["content"]) for m in messages if m["role"] == "assistant" and not m.get("metadata"))
            if text != seen[column]:
                seen[column] = text
                growth[column].append(now)
    assert len(growth[0]) >= 3 and len(growth[1]) >= 3, growth
    # Overlap: each column's text was still growing after the other's had started.
    assert growth[0][0] < growth[1][-1] and growth[1][0] < growth[0][-1], growth
    a, b = ([t - sent for t in growth[column]] for column in (0, 1))
    print(f"\ntext grew, seconds after sending: A {a[0]:.2f}..{a[-1]:.2f} ({len(a)} updates), B {b[0]:.2f}..{b[-1]:.2f} ({len(b)} updates)")
    titles = [messages[-1]["metadata"]["title"] for messages in chatbots[:2]]
    assert all(title.startswith(f"📊 {REPLIED}") and "80 tokens" in title for title in titles), titles
    assert app_server.wait_idle()["engines"][0]["running"] == 0


def test_stop_from_another_request_stops_every_column(app_server):
    """Stop is a separate event of the same session; both columns end as stopped by you."""
    client = api_client(app_server.url)
    job = client.submit(*compare_inputs("Tell me a very long story about a lighthouse keeper.", 400),
                        api_name="/compare")
    started = threading.Event()

    def watch() -> None:
        for update in job:
            bots = column_chats(update)
            if bots and all(any(m["role"] == "assistant" and not m.get("metadata") for m in bot) for bot in bots[:2]):
                started.set()

    watcher = threading.Thread(target=watch)
    watcher.start()
    assert started.wait(90), "both columns should start writing"
    client.predict(api_name="/compare_stop")
    watcher.join(60)
    final = job.outputs()[-1]
    titles = [bot[-1]["metadata"]["title"] for bot in column_chats(final)]
    assert all("stopped by you" in title for title in titles), titles
    assert app_server.wait_idle()["engines"][0]["running"] == 0



def test_malformed_settings_through_the_api_are_refused_with_a_sentence(app_server):
    client = api_client(app_server.url)  # a session of its own: no comparison yet
    result = client.predict([CREATIVE, DETERMINISTIC], False, "Hi", [1, 2], api_name="/compare")
    assert result["status"].startswith("⚠️ sampling is a list") and result["columns"] == [], result
    result = client.predict([CREATIVE, DETERMINISTIC], False, "Hi", [{"temprature": 1}, {}], api_name="/compare")
    assert "Unknown setting 'temprature'" in result["status"] and result["turn"] == 0, result


def test_blind_columns_cannot_be_told_apart_before_the_vote_through_the_api(app_server):
    """Whatever settings a visitor asks for, a blind comparison writes every column with the same ones,
    and before the vote each column's lines read the same."""
    client = api_client(app_server.url)
    apart = client.predict([CREATIVE, DETERMINISTIC], True, "Count to ten.", [{"max_tokens": 1}, {"max_tokens": 3}],
                           api_name="/compare")
    assert apart["status"].startswith("⚠️ In a blind comparison every column writes with the same settings"), apart
    shared = {"max_tokens": 12, "temperature": 0.0}
    result = client.predict([CREATIVE, DETERMINISTIC], True, "Count to ten.", [shared, shared], api_name="/compare")
    lines = [[m["metadata"].get("title") for m in column["messages"] if m["metadata"].get("title")]
             for column in result["columns"]]
    assert lines[0] == lines[1] == ["📊 Stats are shown after you vote: how fast and how long each reply is could "
                                    "tell the columns apart."], lines
    assert [column["title"] for column in result["columns"]] == ["A", "B"]
    assert client.predict("A", None, api_name="/vote")["ok"]
    after = client.predict([CREATIVE, DETERMINISTIC], True, "Count to five.", [shared, shared], api_name="/compare")
    titles = [column["messages"][-1]["metadata"]["title"] for column in after["columns"]]
    assert all(title.startswith(f"📊 {REPLIED}") for title in titles), titles
    assert app_server.wait_idle()["engines"][0]["running"] == 0
