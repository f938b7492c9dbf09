"""The Compare tab: one prompt to two to four presets at once, streamed side by side, voted on.

One event writes every column (`chat.fanout`, through the reply pipeline); the record (turns,
replies, stats, votes) lives in `chat.compare`, the summary and exports in `chat.compare_report`,
the share link in `chat.share_link`, and every vote is also kept in the app's `chat.votes` store for
the leaderboard; this module only draws. The tab is made when first opened (chat/ui/lazy.py);
programs compare and vote through `/compare` and `/vote` (chat/ui/compare_api.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from chat import ballot
from chat.compare import HIDDEN_STATS, LABELS, MAX_COLUMNS, ComparedReply, Comparison
from chat.compare_report import summarize, write_exports
from chat.errors import ChatError, InputError
from chat.fanout import Job, write_all
from chat.presets import Preset
from chat.sampling import KNOB_NAMES, Knob, Sampling
from chat.service import ChatService, ReplyRequest, Waiting, Writing, check_text
from chat.share_link import decode_link, encode_link
from chat.ui.components import PlainNumber, PlainSlider
from chat.ui.downloads import new_folder
from chat.ui.live import REDRAW_S, LiveText, is_browser
from chat.ui.messages import PROBLEM, STATS, STOPPED, WAITING, annotation, event_messages, shown_text, stats_annotation
from chat.voters import Voter
from chat.votes import VoteStore

log = logging.getLogger(__name__)

INTRO = (
    "Send one prompt to several presets at once and read the answers and numbers side by side. "
    "Follow-up prompts continue each column's own conversation. In **blind** mode the columns are "
    "shuffled and labelled A, B, …; vote on each turn, and the names are revealed after your first vote."
)
HIDDEN_DETAILS = "The preset and its exact settings are shown after you vote."
SHARED_SETTINGS = "**Every column** (blind: one set of settings for all, within each preset's ranges)"
EXPORTS = (("md", "Markdown"), ("csv", "CSV"), ("json", "JSON"))
SHOW_LINK = "(query) => query ? window.location.origin + window.location.pathname + query : ''"
K = len(KNOB_NAMES)


@dataclass
class ColumnJob(Job):
    """A column's reply to write, and (for a page) its live text."""

    live: LiveText | None = None


@dataclass
class Board:
    """One browser session's comparison (in gr.State), and where its exports are written."""

    comparison: Comparison | None = None
    export_dir: Path | None = None

    def exports(self) -> dict[str, Path]:
        assert self.comparison is not None
        self.export_dir = self.export_dir or new_folder("compare")
        return write_exports(self.comparison, self.export_dir)


# --- how a column looks --------------------------------------------------------------------


def column_messages(comparison: Comparison, column: int, jobs: Sequence[Job] = ()) -> list[gr.ChatMessage]:
    """The column's conversation: each prompt, its reply with stats beneath, and any reruns."""
    live = {id(job.entry): job for job in jobs}
    messages = []
    for turn in comparison.turns:
        messages.append(gr.ChatMessage(role="user", content=turn.prompt))
        for entry in turn.attempts(column):
            if entry.attempt > 1:
                messages.append(annotation(f"↻ Rerun {entry.attempt - 1} of this prompt, same preset and settings"))
            messages += entry_messages(comparison, entry, live.get(id(entry)))
    return messages


def entry_messages(comparison: Comparison, entry: ComparedReply, job: Job | None) -> list[gr.ChatMessage]:
    """One reply of a column. Blind, until the vote, every column's lines read the same: no engine
    status (it names the preset), no tokens, no times (they tell the columns apart)."""
    blind = comparison.hides_stats
    if not entry.finished:
        if job is None or job.event is None or (blind and isinstance(job.event, Waiting)):
            return [annotation(f"{WAITING} Waiting for the engine…", pending=True)]
        messages = event_messages(job.event, job.live if isinstance(job, ColumnJob) else None)
        if blind and isinstance(job.event, Writing):
            messages[-1] = annotation(f"{WAITING} Writing…", pending=True)
        return messages
    messages = [gr.ChatMessage(role="assistant", content=shown_text(entry.text))] if entry.text else []
    if entry.error:
        messages.append(annotation(f"{STOPPED if entry.stopped_early else PROBLEM} {entry.error}"))
    elif entry.stats is not None and not blind:
        messages.append(stats_annotation(entry.stats, entry.notice))
    elif entry.stats is not None:
        messages.append(annotation(f"{STATS} {HIDDEN_STATS}", HIDDEN_DETAILS))
    return messages


def summary_frames(comparison: Comparison | None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The summary table, then the time-to-first-token and speed charts' data."""
    rows = summarize(comparison) if comparison else []

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds * 1000)

    def one(value: float | None) -> float | None:
        return None if value is None else round(value, 1)

    table = pd.DataFrame(
        [[r.label, r.preset, r.replies, ms(r.first_token_median_s), ms(r.first_token_p95_s), one(r.tokens_per_s_median),
          one(r.length_median_tokens), r.votes_won] for r in rows],
        columns=["Column", "Preset", "Replies", "Median first token (ms)", "95th percentile first token (ms)",
                 "Median tokens/s", "Median length (tokens)", "Votes won"],
    )
    first_token = pd.DataFrame(
        [{"bar": f"{r.label} {name}", "ms": ms(value)}
         for r in rows for name, value in (("median", r.first_token_median_s), ("p95", r.first_token_p95_s)) if value is not None],
        columns=["bar", "ms"],
    ).astype({"ms": float})  # typed even when empty: the chart reads its axis type from the first value
    speed = pd.DataFrame([{"column": r.label, "tokens/s": one(r.tokens_per_s_median)} for r in rows if r.tokens_per_s_median],
                         columns=["column", "tokens/s"]).astype({"tokens/s": float})
    return table, first_token, speed


def begin_turn(service: ChatService, board: Board, picked: Sequence[str], blind: bool, prompt: str,
               settings: Sequence[Mapping[str, Any]], session: str) -> list[ColumnJob]:
    """Add the prompt as a turn of the session's comparison (starting it with the picked presets on
    the first one): one job per column, with that column's preset and settings (`settings[i]` for
    `picked[i]`). Raises ChatError with a sentence for the person (nothing is added then)."""
    text = check_text(prompt, "Your message", new_message=True)
    comparison = board.comparison or Comparison.start([service.preset(name) for name in picked], blind)
    presets = [service.preset(column.preset) for column in comparison.columns]
    if comparison.hides_stats:  # blind: every column writes with the same settings, or they could be told apart
        base = service.preset(picked[0]) if picked else presets[0]
        shared = base.sampling.resolve(settings[0] if settings else {}).as_dict()
        sampling = [preset.sampling.resolve(shared) for preset in presets]
    else:
        sampling = [sampling_of(preset, picked, settings) for preset in presets]
    board.comparison = comparison
    turn = comparison.add_turn(text, sampling)
    now = time.monotonic()  # one moment for all columns: their first-token times compare
    return [job(comparison, entry, len(comparison.turns) - 1, session, now) for entry in turn.replies]


def sampling_of(preset: Preset, picked: Sequence[str], settings: Sequence[Mapping[str, Any]]) -> Sampling:
    """A picked preset's settings (those of its slot), checked against its ranges."""
    if preset.name not in picked:
        raise InputError(f"{preset.name} is not among the picked presets; press New comparison to change them.")
    slot = list(picked).index(preset.name)
    return preset.sampling.resolve(settings[slot] if slot < len(settings) else {})


def slot_settings(knob_values: Sequence[Any]) -> list[dict[str, Any]]:
    """The settings sliders' values (every knob of the first slot, then of the second, …) by slot."""
    return [dict(zip(KNOB_NAMES, knob_values[slot * K:(slot + 1) * K], strict=True)) for slot in range(MAX_COLUMNS)]


def job(comparison: Comparison, entry: ComparedReply, turn: int, session: str, submitted_at: float) -> ColumnJob:
    """The request that writes one column's reply to a turn, with that column's preset and settings."""
    column = comparison.columns[entry.column]
    return ColumnJob(entry, ReplyRequest(
        comparison.turns[turn].prompt, comparison.history(entry.column, turn), preset=column.preset,
        system_prompt=column.system_prompt, sampling=entry.sampling, stop_key=stop_key(session),
        submitted_at=submitted_at,
    ))


def knob_input(knob: Knob, slot: int) -> gr.components.Component:
    kind = PlainNumber if knob.name == "seed" else PlainSlider
    extra = {"precision": 0} if knob.name == "seed" else {"step": knob.step}
    return kind(value=knob.default, minimum=knob.minimum, maximum=knob.maximum, label=knob.label, info=knob.help,
                elem_id=f"compare-knob-{slot}-{knob.name}", interactive=True, **extra)


class CompareTab:
    """The tab's components, and its events as methods (each returns updates keyed by component)."""

    def __init__(self, service: ChatService, demo: gr.Blocks, tabs: gr.Tabs, store: VoteStore | None = None) -> None:
        self.service = service
        self.store = store  # where votes last (None: in this page only)
        self.demo, self.tabs = demo, tabs  # a share link opens this tab when the page loads
        self.writing: set[str] = set()  # sessions writing replies now (one comparison turn at a time)
        names = service.preset_names()
        first = names[:2]
        # Inputs say they are: Gradio guesses it from the events' inputs, and inside gr.render
        # (the tab is made when opened) it guesses some of them wrong.
        gr.Markdown(INTRO, elem_id="compare-intro")
        self.board, self.slot_names = gr.State(Board()), gr.State(first)
        with gr.Row():
            self.picked = gr.CheckboxGroup(names, value=first, label="Presets to compare", scale=3, elem_id="compare-presets",
                                           interactive=True,
                                           info="Two to four. Presets on one model share its engine.")
            # Blind from the start: a first visitor's judgement is not swayed by the names.
            self.blind = gr.Checkbox(value=True, label="Blind", scale=1, elem_id="compare-blind", interactive=True,
                                     info="Hide which preset wrote which column until you vote.")
        # The prompt comes before the columns: on a laptop and on a phone it is on the first screen,
        # with a share link's "press Send" beneath it.
        with gr.Row(elem_id="compare-ask"):
            self.prompt = gr.Textbox(placeholder="One prompt for every column; press Enter to send", show_label=False,
                                     scale=6, min_width=200, elem_id="compare-prompt", interactive=True)
            self.send = gr.Button("Send", variant="primary", scale=1, min_width=70, elem_id="compare-send")
            self.stop = gr.Button("Stop", variant="stop", scale=1, min_width=70, elem_id="compare-stop")
            self.new = gr.Button("New comparison", scale=1, min_width=70, elem_id="compare-new")
        self.status = gr.Markdown(elem_id="compare-status")
        self.slot_boxes, self.slot_headings, self.knobs = [], [], []
        with gr.Accordion("Settings per preset", open=False, elem_id="compare-settings"), gr.Row():
            for slot in range(MAX_COLUMNS):
                preset = service.preset(first[slot] if slot < len(first) else None)
                with gr.Column(visible=slot < 1, min_width=220) as box:  # blind: one set for every column
                    self.slot_boxes.append(box)
                    self.slot_headings.append(gr.Markdown(SHARED_SETTINGS if slot == 0 else f"**{preset.name}**"))
                    self.knobs += [knob_input(knob, slot) for knob in preset.sampling.knobs]
        self.column_boxes, self.headings, self.chatbots, self.reruns = [], [], [], []
        with gr.Row(equal_height=False):
            for i in range(MAX_COLUMNS):
                with gr.Column(visible=i < len(first), min_width=260) as box:
                    self.column_boxes.append(box)
                    self.headings.append(gr.Markdown(f"### {LABELS[i]}" if i < len(first) else "",
                                                     elem_id=f"compare-heading-{i}"))
                    self.chatbots.append(gr.Chatbot(show_label=False, elem_id=f"compare-chat-{i}", min_height=380, height=520,
                                                   buttons=["copy", "copy_all"]))  # no unnamed "share" (Spaces only)
                    self.reruns.append(gr.Button("Rerun with these settings", size="sm", elem_id=f"compare-rerun-{i}"))
        with gr.Row():
            self.votes = [gr.Button(visible=False, elem_id=f"compare-vote-{i}", min_width=100) for i in range(MAX_COLUMNS + 2)]
            self.rerun_turn = gr.Dropdown([], label="Turn that Rerun repeats", elem_id="compare-rerun-turn", scale=2,
                                          interactive=True)
        gr.Markdown("### Session summary")
        table, first_token, speed = summary_frames(None)
        self.table = gr.Dataframe(table, interactive=False, elem_id="compare-summary", show_label=False)
        with gr.Row():
            self.first_token_plot = gr.BarPlot(first_token, x="bar", y="ms", y_lim=[0, None], height=260,
                                               title="Time to first token: median and 95th percentile", x_title="Column and statistic",
                                               y_title="ms", elem_id="compare-ttft-plot")
            self.speed_plot = gr.BarPlot(speed, x="column", y="tokens/s", y_lim=[0, None], height=260,
                                         title="Tokens per second (median)", x_title="Column", y_title="tokens/s",
                                         elem_id="compare-speed-plot")
        with gr.Row():
            self.downloads = [gr.DownloadButton(f"Download {name}", interactive=False, elem_id=f"compare-export-{ext}")
                              for ext, name in EXPORTS]
            self.share = gr.Button("Make a share link", elem_id="compare-share")
        self.link = gr.Textbox(label="Share link: opens this setup (presets, settings, prompt)", interactive=False,
                               buttons=["copy"], elem_id="compare-link")
        self.link_query = gr.Textbox(visible=False)
        self.wire()

    @property
    def outputs(self) -> list[Any]:
        return [self.board, self.status, self.prompt, self.picked, self.blind, *self.column_boxes, *self.headings,
                *self.chatbots, *self.votes, self.rerun_turn, self.table, self.first_token_plot, self.speed_plot,
                *self.downloads, self.link_query]

    @property
    def setup_outputs(self) -> list[Any]:
        return [self.slot_names, *self.slot_boxes, *self.slot_headings, *self.knobs, *self.column_boxes, *self.headings]

    def wire(self) -> None:
        quick = {"queue": False, "api_visibility": "undocumented", "show_progress": "hidden"}
        streaming = {"concurrency_limit": None, "show_progress": "hidden"}  # never one person at a time
        gr.on([self.send.click, self.prompt.submit], self.compare, [self.board, self.picked, self.blind, self.prompt,
              *self.knobs], self.outputs, api_visibility="undocumented", **streaming)
        for column, button in enumerate(self.reruns):
            button.click(self.rerun_in(column), [self.board, self.rerun_turn], self.outputs,
                         api_visibility="undocumented", **streaming)
        for index, button in enumerate(self.votes):
            button.click(self.vote_for(index), [self.board], self.outputs, **quick)
        self.stop.click(self.stop_all, None, None, **quick)
        self.new.click(self.start_over, [self.board, self.picked, self.blind], self.outputs, **quick)
        self.picked.input(self.pick, [self.picked, self.blind, self.slot_names, *self.knobs],
                          [self.picked, self.status, *self.setup_outputs], **quick)
        self.blind.input(self.blind_changed, [self.picked, self.blind], self.setup_outputs, **quick)
        self.share.click(self.share_link, [self.picked, self.blind, self.prompt, self.board, *self.knobs],
                         [self.link_query, self.status], **quick)
        self.link_query.change(None, [self.link_query], [self.link], js=SHOW_LINK, **quick)
        load_outputs = [*self.setup_outputs, self.picked, self.blind, self.prompt, self.link_query, self.status, self.tabs]
        self.demo.load(self.open_link, None, load_outputs, **quick)

    # --- views -------------------------------------------------------------------------------

    def headings_of(self, comparison: Comparison | None, picked: Sequence[str], blind: bool) -> dict[Any, Any]:
        count = len(comparison.columns) if comparison else len(picked)
        out: dict[Any, Any] = {box: gr.Column(visible=i < count) for i, box in enumerate(self.column_boxes)}
        for i in range(count):
            title = comparison.title(i) if comparison else LABELS[i] + ("" if blind else f" · {picked[i]}")
            out[self.headings[i]] = f"### {title}"
        return out

    def chats(self, comparison: Comparison | None, jobs: Sequence[Job] = ()) -> dict[Any, Any]:
        return {bot: column_messages(comparison, i, jobs) if comparison and i < len(comparison.columns) else []
                for i, bot in enumerate(self.chatbots)}

    def after_turn(self, board: Board) -> dict[Any, Any]:
        """Votes, rerun choices, summary, charts and exports, as they are after a turn or a vote."""
        comparison = board.comparison
        turns = comparison.turns if comparison else []
        table, first_token, speed = summary_frames(comparison)
        out: dict[Any, Any] = {self.board: board, self.table: table, self.first_token_plot: first_token,
                               self.speed_plot: speed}
        options = comparison.vote_options() if comparison and turns else []
        voted = bool(turns and turns[-1].vote)
        for i, button in enumerate(self.votes):
            out[button] = gr.Button(options[i][0], visible=True, interactive=not voted) if i < len(options) else gr.Button(visible=False)
        choices = [(f"{n}: {turn.prompt[:50]}", n - 1) for n, turn in enumerate(turns, 1)]
        out[self.rerun_turn] = gr.Dropdown(choices=choices, value=len(turns) - 1 if turns else None)
        paths = board.exports() if turns else {}
        for (ext, _), button in zip(EXPORTS, self.downloads, strict=True):
            out[button] = gr.DownloadButton(value=str(paths[ext]) if ext in paths else None, interactive=ext in paths)
        return out

    def setup(self, names: Sequence[str], values_by_name: dict[str, dict[str, Any]], blind: bool = False) -> dict[Any, Any]:
        """One settings slot per picked preset, with its ranges and the given (or its default) values;
        blind, only the first, which every column then uses."""
        out: dict[Any, Any] = {self.slot_names: list(names), **self.slots_shown(names, blind)}
        for slot in range(min(len(names), MAX_COLUMNS)):
            preset = self.service.preset(names[slot])
            values = values_by_name.get(preset.name) or preset.sampling.defaults.as_dict()
            for knob, component in zip(preset.sampling.knobs, self.knobs[slot * K:(slot + 1) * K], strict=True):
                out[component] = gr.update(minimum=knob.minimum, maximum=knob.maximum, value=values[knob.name])
        return out

    def slots_shown(self, names: Sequence[str], blind: bool) -> dict[Any, Any]:
        out: dict[Any, Any] = {box: gr.Column(visible=slot < (min(len(names), 1) if blind else len(names)))
                               for slot, box in enumerate(self.slot_boxes)}
        for slot, heading in enumerate(self.slot_headings[:len(names)]):
            out[heading] = SHARED_SETTINGS if blind and slot == 0 else f"**{names[slot]}**"
        return out

    def blind_changed(self, picked: list[str], blind: bool) -> dict[Any, Any]:
        return {**self.headings_of(None, picked, blind), **self.slots_shown(picked[:MAX_COLUMNS], blind)}

    def link_of(self, picked: Sequence[str], blind: bool, prompt: str, knob_values: Sequence[Any]) -> str:
        presets = [self.service.preset(name) for name in picked]
        return encode_link(presets, [sampling_of(p, picked, slot_settings(knob_values)) for p in presets], prompt, blind)

    # --- events ------------------------------------------------------------------------------

    async def drive(self, board: Board, jobs: list[ColumnJob], request: gr.Request,
                    first: dict[Any, Any]) -> AsyncIterator[dict[Any, Any]]:
        """Yield `first`, stream the jobs into their columns, finish with the summary, votes and exports.
        A page gets each column's text live (chat/ui/live.py), and Gradio's redraws once a second."""
        session = request.session_hash or ""
        self.writing.add(session)  # before any await: a second Send is refused
        browser = is_browser(request)
        blind = board.comparison is not None and board.comparison.hides_stats
        for each in jobs if browser else ():
            each.live = live = LiveText(self.service.logs)
            # Blind, the line beneath each column is "Writing…" until the vote: its figures would
            # tell the columns apart, so they do not travel with the text either.
            each.on_writing = (lambda event, live=live: live.write(event.reply.text)) if blind else \
                (lambda event, live=live: live.write(event.reply.text, event.line()))
        try:
            yield first
            async with contextlib.aclosing(write_all(self.service, jobs, REDRAW_S if browser else 0.0)) as redraws:
                async for _ in redraws:
                    yield self.chats(board.comparison, jobs)
            yield {**self.chats(board.comparison), **self.after_turn(board)}
        finally:
            self.writing.discard(session)
            for each in jobs:
                if each.live is not None:
                    each.live.end()

    async def compare(self, request: gr.Request, board: Board, picked: list[str], blind: bool, prompt: str,
                      *knob_values: Any) -> AsyncIterator[dict[Any, Any]]:
        """Send the prompt to every column (starting the comparison on the first one)."""
        session = request.session_hash or ""
        if session in self.writing:
            yield {self.status: f"{PROBLEM} Wait until every column has finished, or press Stop."}
            return
        try:
            started = board.comparison
            first_prompt = started.turns[0].prompt if started and started.turns else prompt
            query = self.link_of(picked, started.blind if started else blind, first_prompt, knob_values)
            jobs = begin_turn(self.service, board, picked, blind, prompt, slot_settings(knob_values), session)
        except ChatError as exc:
            yield {self.status: f"{PROBLEM} {exc.message}"}
            return
        comparison = board.comparison
        assert comparison is not None
        first = {self.board: board, self.prompt: "", self.status: "", self.link_query: query,
                 self.picked: gr.CheckboxGroup(interactive=False), self.blind: gr.Checkbox(interactive=False),
                 **self.headings_of(comparison, picked, blind), **self.chats(comparison, jobs),
                 **{button: gr.Button(interactive=False) for button in self.votes}}
        async for update in self.drive(board, jobs, request, first):
            yield update

    def rerun_in(self, column: int) -> Callable[..., AsyncIterator[dict[Any, Any]]]:
        async def rerun(board: Board, turn: int | None, request: gr.Request) -> AsyncIterator[dict[Any, Any]]:
            """That turn's prompt again, in this column, with its preset and exact settings."""
            comparison, session = board.comparison, request.session_hash or ""
            if comparison is None or not comparison.turns or column >= len(comparison.columns):
                yield {self.status: f"{PROBLEM} Send a prompt first; then each column can rerun it."}
                return
            if session in self.writing:
                yield {self.status: f"{PROBLEM} Wait until every column has finished, or press Stop."}
                return
            index = len(comparison.turns) - 1 if turn is None else int(turn)
            try:
                entry = comparison.add_rerun(index, column)
            except ChatError as exc:
                yield {self.status: f"{PROBLEM} {exc.message}"}
                return
            rerun_job = job(comparison, entry, index, session, time.monotonic())
            first = {self.status: "", **self.chats(comparison, [rerun_job]),
                     **{b: gr.Button(interactive=False) for b in self.votes}}
            async for update in self.drive(board, [rerun_job], request, first):
                yield update

        return rerun

    def vote_for(self, index: int) -> Callable[[Board, gr.Request], Any]:
        async def vote_button(board: Board, request: gr.Request) -> dict[Any, Any]:
            comparison = board.comparison
            options = comparison.vote_options() if comparison else []
            try:
                if comparison is None or index >= len(options):
                    raise InputError("Send a prompt first, then vote on the replies.")
                voter = Voter.of(self.store.keys, request) if self.store is not None else None
                cast = await ballot.cast(comparison, options[index][1], request.session_hash or "", self.store, voter)
            except ChatError as exc:
                return {self.status: f"{PROBLEM} {exc.message}"}
            return {self.status: ballot.said(comparison, cast), **self.headings_of(comparison, [], False),
                    **self.chats(comparison), **self.after_turn(board)}

        return vote_button

    async def stop_all(self, request: gr.Request) -> None:  # async: stopping aborts on the server's event loop
        self.service.stop(stop_key(request.session_hash or ""))

    async def start_over(self, request: gr.Request, board: Board, picked: list[str], blind: bool) -> dict[Any, Any]:
        await self.stop_all(request)
        board.comparison = None
        return {self.status: "", self.picked: gr.CheckboxGroup(interactive=True), self.blind: gr.Checkbox(interactive=True),
                **self.headings_of(None, picked, blind), **self.chats(None), **self.after_turn(board)}

    def pick(self, picked: list[str], blind: bool, slot_names: list[str], *knob_values: Any) -> dict[Any, Any]:
        """Presets picked or unpicked: show their settings, keeping the values of those still picked."""
        kept = picked[:MAX_COLUMNS]
        old = {name: dict(zip(KNOB_NAMES, knob_values[i * K:(i + 1) * K], strict=True)) for i, name in enumerate(slot_names)}
        status = f"{PROBLEM} Compare at most four presets at once." if len(picked) > MAX_COLUMNS else ""
        return {**self.setup(kept, {name: old[name] for name in kept if name in old}, blind),
                **self.headings_of(None, kept, blind), self.picked: kept, self.status: status}

    def share_link(self, picked: list[str], blind: bool, prompt: str, board: Board, *knob_values: Any) -> dict[Any, Any]:
        turns = board.comparison.turns if board.comparison else []
        try:
            return {self.link_query: self.link_of(picked, blind, prompt or (turns[0].prompt if turns else ""), knob_values),
                    self.status: ""}
        except ChatError as exc:
            return {self.status: f"{PROBLEM} {exc.message}"}

    def open_link(self, request: gr.Request) -> dict[Any, Any]:
        """A share link (?p=...&p=...&s1=...&q=...) opens this tab with its setup filled in."""
        params = request.query_params
        pairs = params.multi_items() if hasattr(params, "multi_items") else list(dict(params).items())
        problem = ""
        try:
            found = decode_link(pairs, self.service.preset)
        except ChatError as exc:
            found, problem = None, f"{PROBLEM} This comparison link could not be opened: {exc.message}"
        out: dict[Any, Any] = {}
        if isinstance(self.tabs, gr.Tabs) and (found or problem):
            out[self.tabs] = gr.Tabs(selected="compare")
        if found is None:  # nothing to open; Gradio takes an empty dict for one value, so skip the status
            return {**out, self.status: problem or gr.skip()}
        values = {name: sampling.as_dict() for name, sampling in zip(found.presets, found.sampling, strict=True)}
        presets = [self.service.preset(name) for name in found.presets]
        return {**out, **self.setup(found.presets, values, found.blind), **self.headings_of(None, found.presets, found.blind),
                self.picked: list(found.presets), self.blind: found.blind, self.prompt: found.prompt,
                self.link_query: encode_link(presets, found.sampling, found.prompt, found.blind),
                self.status: "Opened from a share link: press Send to run it."}


def stop_key(session: str) -> str:
    """Compare's Stop stops every column of this browser session (not its Chat tab's reply)."""
    return f"compare:{session}"


def compare_tab(service: ChatService, demo: gr.Blocks, tabs: gr.Tabs, store: VoteStore | None = None) -> CompareTab:
    return CompareTab(service, demo, tabs, store)
