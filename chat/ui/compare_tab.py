"""The Compare tab: one prompt to two to four presets at once, streamed side by side, voted on.

What a comparison does (a turn, reruns, writing every column at once, stop) is `chat.compare_service`,
shared with the /compare API (chat/ui/compare_api.py); the record is `chat.compare`, the summary
and exports `chat.compare_report`, the share link `chat.share_link`, votes `chat.ballot` (kept in
the app's `chat.votes` store for the leaderboard); how a column looks is `chat.ui.compare_view`.
This module lays out the tab and wires its events. It is made when first opened (chat/ui/lazy.py).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from chat import ballot
from chat.compare import LABELS, MAX_COLUMNS, Comparison
from chat.compare_report import write_exports
from chat.compare_service import Begun, Busy, CompareEvent, CompareService, Job, Redraw
from chat.errors import ChatError, InputError
from chat.live import ReplyStore, live_columns
from chat.sampling import KNOB_NAMES, Knob
from chat.share_link import decode_link, encode_link
from chat.ui.compare_view import column_messages, summary_frames
from chat.ui.components import PlainNumber, PlainSlider
from chat.ui.downloads import new_folder
from chat.ui.live_script import is_browser
from chat.ui.messages import PROBLEM
from chat.ui.tables import Table
from chat.voters import Voter, visitor_of
from chat.votes import VoteStore

log = logging.getLogger(__name__)

INTRO = (
    "Send one prompt to several presets at once and read the answers and numbers side by side. "
    "Follow-up prompts continue each column's own conversation. In **blind** mode the columns are "
    "shuffled and labelled A, B, …; vote on each turn, and the names are revealed after your first vote."
)
SHARED_SETTINGS = "**Every column** (blind: one set of settings for all, within each preset's ranges)"
EXPORTS = (("md", "Markdown"), ("csv", "CSV"), ("json", "JSON"))
BUSY = f"{PROBLEM} Wait until every column has finished, or press Stop."
SHOW_LINK = "(query) => query ? window.location.origin + window.location.pathname + query : ''"
K = len(KNOB_NAMES)


@dataclass
class Board:
    """One browser session's comparison (in gr.State), and where its exports are written."""

    comparison: Comparison | None = None
    export_dir: Path | None = None

    def exports(self) -> dict[str, Path]:
        assert self.comparison is not None
        self.export_dir = self.export_dir or new_folder("compare")
        return write_exports(self.comparison, self.export_dir)


def slot_settings(knob_values: Sequence[Any]) -> list[dict[str, Any]]:
    """The settings sliders' values (every knob of the first slot, then of the second, …) by slot."""
    return [dict(zip(KNOB_NAMES, knob_values[slot * K:(slot + 1) * K], strict=True)) for slot in range(MAX_COLUMNS)]


def knob_input(knob: Knob, slot: int) -> gr.components.Component:
    kind = PlainNumber if knob.name == "seed" else PlainSlider
    extra = {"precision": 0} if knob.name == "seed" else {"step": knob.step}
    return kind(value=knob.default, minimum=knob.minimum, maximum=knob.maximum, label=knob.label, info=knob.help,
                elem_id=f"compare-knob-{slot}-{knob.name}", interactive=True, **extra)


class CompareTab:
    """The tab's components, and its events as methods (each returns updates keyed by component)."""

    def __init__(self, comparisons: CompareService, logs: ReplyStore, demo: gr.Blocks, tabs: gr.Tabs,
                 store: VoteStore | None = None) -> None:
        self.comparisons, self.service, self.logs = comparisons, comparisons.service, logs
        self.store = store  # where votes last (None: in this page only)
        self.demo, self.tabs = demo, tabs  # a share link opens this tab when the page loads
        names = self.service.preset_names()
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
                preset = self.service.preset(first[slot] if slot < len(first) else None)
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
        self.table = Table(table, label="Session summary", empty="No replies yet.", elem_id="compare-summary")
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
        # "multiple": a Send or Enter while a turn runs reaches the server, which says to wait (Busy) and
        # leaves the prompt in the box; Gradio's default ("once") dropped it in the page without a word.
        gr.on([self.send.click, self.prompt.submit], self.compare, [self.board, self.picked, self.blind, self.prompt,
              *self.knobs], self.outputs, api_visibility="undocumented", trigger_mode="multiple", **streaming)
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

    def chats(self, comparison: Comparison | None, jobs: Sequence[Job] = (),
              live_ids: dict[int, str] | None = None) -> dict[Any, Any]:
        return {bot: column_messages(comparison, i, jobs, live_ids) if comparison and i < len(comparison.columns) else []
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

    # --- events ------------------------------------------------------------------------------

    async def drive(self, board: Board, send: Callable[[float], AsyncGenerator[CompareEvent, None]], request: gr.Request,
                    first: Callable[[Begun], dict[Any, Any]]) -> AsyncGenerator[dict[Any, Any], None]:
        """Write a turn (`send(every_s)`: the service's send or rerun): `first` once it is in the
        record, then the columns as they are written, then the summary, votes and exports. A page
        gets each column's text live (chat/live.py), and Gradio's redraws once a second."""
        jobs: list[Job] = []
        async with contextlib.aclosing(live_columns(send, self.logs, is_browser(request), visitor_of(request))) as events:
            async for event, live_ids in events:
                if isinstance(event, Begun):
                    board.comparison, jobs = event.comparison, event.jobs
                    yield first(event)
                elif isinstance(event, Redraw):
                    yield self.chats(board.comparison, jobs, live_ids)
                else:
                    yield {**self.chats(board.comparison), **self.after_turn(board)}

    async def compare(self, request: gr.Request, board: Board, picked: list[str], blind: bool, prompt: str,
                      *knob_values: Any) -> AsyncIterator[dict[Any, Any]]:
        """Send the prompt to every column (starting the comparison on the first one)."""
        send = functools.partial(self.comparisons.send, board.comparison, picked, blind, prompt, slot_settings(knob_values),
                                 request.session_hash or "", link=True, visitor=visitor_of(request))

        def first(begun: Begun) -> dict[Any, Any]:
            return {self.board: board, self.prompt: "", self.status: "", self.link_query: begun.link,
                    self.picked: gr.CheckboxGroup(interactive=False), self.blind: gr.Checkbox(interactive=False),
                    **self.headings_of(begun.comparison, picked, blind), **self.chats(begun.comparison, begun.jobs),
                    **{button: gr.Button(interactive=False) for button in self.votes}}

        async with contextlib.aclosing(self.shown(self.drive(board, send, request, first))) as updates:  # see `shown`
            async for update in updates:
                yield update

    def rerun_in(self, column: int) -> Callable[..., AsyncIterator[dict[Any, Any]]]:
        async def rerun(board: Board, turn: int | None, request: gr.Request) -> AsyncIterator[dict[Any, Any]]:
            """That turn's prompt again, in this column, with its preset and exact settings."""
            send = functools.partial(self.comparisons.rerun, board.comparison, turn, column, request.session_hash or "",
                                     visitor=visitor_of(request))

            def first(begun: Begun) -> dict[Any, Any]:
                return {self.status: "", **self.chats(begun.comparison, begun.jobs),
                        **{b: gr.Button(interactive=False) for b in self.votes}}

            async with contextlib.aclosing(self.shown(self.drive(board, send, request, first))) as updates:
                async for update in updates:
                    yield update

        return rerun

    async def shown(self, updates: AsyncGenerator[dict[Any, Any], None]) -> AsyncGenerator[dict[Any, Any], None]:
        """The updates, or the sentence that says why the turn was refused or failed. Its callers close it
        when they are closed (Gradio's /cancel closes a turn between updates): a generator merely dropped
        is closed whenever the garbage collector gets to it, and its replies are written until then."""
        try:
            async with contextlib.aclosing(updates):  # closing this cancels the replies
                async for update in updates:
                    yield update
        except Busy as exc:
            # The same prompt again (a Send clicked twice, its turn being written) changes nothing;
            # something must still be yielded: a generator that yields nothing sets every output to None.
            yield {self.status: gr.skip() if exc.again else BUSY}
        except ChatError as exc:
            yield {self.status: f"{PROBLEM} {exc.message}"}

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
        self.comparisons.stop(request.session_hash or "")

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
            return {self.link_query: self.comparisons.link(picked, blind, prompt or (turns[0].prompt if turns else ""),
                                                           slot_settings(knob_values)),
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


def compare_tab(comparisons: CompareService, logs: ReplyStore, demo: gr.Blocks, tabs: gr.Tabs,
                store: VoteStore | None = None) -> CompareTab:
    return CompareTab(comparisons, logs, demo, tabs, store)
