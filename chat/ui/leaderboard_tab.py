"""The Leaderboard tab: presets ranked by every visitor's blind Compare votes, with 95% intervals.

The ranking is chat.leaderboard's (a Bradley-Terry fit with bootstrap intervals, named only in the
fold "How the ranking works": visitors read what it does); the votes are
chat.votes'. One `Standings` is shared by every session: it ranks again only when the votes changed
(a bootstrap takes about half a second of CPU, which the engine would otherwise lose at every
visitor's refresh), one ranking at a time. Only administrators see and may use Reset.
"""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from chat import leaderboard, vote_exports, votes
from chat.admin import NOT_ADMIN, Admins
from chat.charts import NARROW, Interval, interval_chart
from chat.leaderboard import BASE, FEW_VOTES, METHOD, ROUNDS, SCALE, Leaderboard, rank_async
from chat.ui.downloads import new_folder
from chat.ui.messages import PROBLEM
from chat.ui.svg_png import save_png_js
from chat.ui.tables import Table
from chat.votes import VoteStore

INTRO = (
    "Presets ranked by every visitor's blind votes in **Compare**: each vote is a win for the reply picked "
    "over the others (a tie, or all bad, is half a win each), and every preset gets the rating that best explains who "
    "beat whom. A gap of 100 points means the higher preset wins about 64% of the time. The likely range "
    "shows how sure a rating is; presets whose ranges overlap share a rank."
)
HOW = (
    f"The method is Chatbot Arena's: a **{METHOD} model** fitted to the votes by maximum likelihood, "
    f"every vote split into pairwise battles and a tie counting half a win each way. Ratings are on an "
    f"Elo-like scale, {BASE:.0f} + {SCALE:.0f} × log10(strength), centred so the average preset is {BASE:.0f}. "
    f"The likely range is a **95% bootstrap interval**: the votes are drawn again with replacement "
    f"{ROUNDS:,} times and refitted, and the range holds the middle 95% of those ratings. When every "
    f"redraw gives the same rating (one vote, or votes that all agree) there is no range to show: with fewer "
    f"than {FEW_VOTES} votes the table says *not enough votes yet*, with more *±0*. Only blind votes count "
    "unless you tick the box: once the names are shown, a vote says as much about the names as the replies."
)
EMPTY = "No blind votes yet. Compare two presets in the **Compare** tab with **Blind** on and vote: the ranking appears here."
COLUMNS = ["Rank", "Preset", "Rating", "Likely range", "Votes", "Won · tied · lost", "Win rate",
           "Replied after, median (s)", "Tokens a second, median"]
# The votes hold every visitor's prompts and replies: only administrators get them.
DOWNLOADS = (("leaderboard", "csv", "Table CSV"), ("leaderboard", "json", "Table JSON"))
ADMIN_DOWNLOADS = (("votes", "csv", "Votes CSV"), ("votes", "json", "Votes JSON"))
WIDE = 820  # the chart's width on a wide screen
KEEP_EXPORTS = 4  # export folders kept (Gradio copies a file into its cache when it sends it)


@dataclass(frozen=True)
class View:
    board: Leaderboard
    votes: int  # every stored vote, counted or not
    files: dict[tuple[str, str], Path]  # (what, format) -> file


class Standings:
    """The leaderboard as every session sees it, ranked again only when the votes change."""

    def __init__(self, store: VoteStore) -> None:
        self.store = store
        self._lock = asyncio.Lock()
        self._views: dict[bool, tuple[tuple[Any, ...], View]] = {}
        self._root = new_folder("leaderboard")
        self._made = 0

    async def view(self, include_revealed: bool = False) -> View:
        async with self._lock:
            records = await self.store.votes_async()
            key = (len(records), records[0].id if records else None, records[-1].id if records else None)
            cached = self._views.get(include_revealed)
            if cached is not None and cached[0] == key:
                return cached[1]
            board = await rank_async(records, include_revealed=include_revealed)
            folder = self._root / f"{self._made:06d}"
            self._made += 1
            files = await asyncio.to_thread(self._write, records, board, folder)
            view = View(board, len(records), files)
            self._views[include_revealed] = (key, view)
            return view

    def _write(self, records: list[votes.VoteRecord], board: Leaderboard, folder: Path) -> dict[tuple[str, str], Path]:
        files = {("votes", ext): path for ext, path in vote_exports.write_exports(records, folder).items()}
        files.update({("leaderboard", ext): path for ext, path in leaderboard.write_exports(board, folder).items()})
        for old in sorted(self._root.iterdir())[:-KEEP_EXPORTS]:
            shutil.rmtree(old, ignore_errors=True)
        return files

    async def reset(self) -> int:
        async with self._lock:
            self._views.clear()
            return await self.store.reset_async()


def table(board: Leaderboard) -> pd.DataFrame:
    def seconds(value: float | None) -> float | None:
        return None if value is None else round(value, 2)

    rows = [[s.rank, s.preset, round(s.rating), s.range_text(), s.votes,
             f"{s.wins} · {s.ties} · {s.losses}", "" if s.win_rate is None else f"{s.win_rate:.0%}",
             seconds(s.first_token_median_s), None if s.tokens_per_s_median is None else round(s.tokens_per_s_median, 1)]
            for s in board.standings]
    return pd.DataFrame(rows, columns=COLUMNS)


def summary(view: View, include_revealed: bool) -> str:
    board = view.board
    if not board.standings:
        left = f" ({view.votes:,} vote{'s' if view.votes != 1 else ''} cast after the names were shown are left out.)" \
            if view.votes else ""
        return EMPTY + left
    kind = ("vote" if include_revealed else "blind vote") + ("s" if board.votes_counted != 1 else "")
    voters = f"{board.voters:,} voter{'s' if board.voters != 1 else ''}"
    text = f"**{board.votes_counted:,} {kind}** from {voters}, ranked over {len(board.standings)} presets."
    if board.votes_left_out:
        text += (f" {board.votes_left_out:,} vote{'s' if board.votes_left_out != 1 else ''} cast after the names "
                 "were shown are left out; tick the box to count them too.")
    if board.votes_counted < FEW_VOTES:
        text += (f" With fewer than {FEW_VOTES} votes the likely ranges are narrower than the truth (a few votes "
                 "drawn again hardly differ): read this ranking as a first hint.")
    return text


def chart(board: Leaderboard) -> str:
    if not board.standings:
        return ""
    rows = [Interval(s.preset, s.rating, s.ci_low, s.ci_high,
                     f"{s.preset}: rank {s.rank}, rating {s.rating:.0f} (likely range {s.range_text()}), "
                     f"{s.votes} vote{'s' if s.votes != 1 else ''}",
                     note=None if s.has_spread else ("too few votes" if s.votes < FEW_VOTES else "±0"))
            for s in board.standings]
    caption = [f"{board.votes_counted:,} vote{'s' if board.votes_counted != 1 else ''} counted · a tie is half a win each · "
               f"likely ranges from drawing the votes again {board.rounds:,} times · made {board.made_at}"]
    drawn = {width: interval_chart(rows, title="Rating with its likely range", axis_title="Rating (average preset = 1000)",
                                   reference=BASE, reference_label="average", caption=caption, width=width)
             for width in (WIDE, NARROW)}
    # Drawn twice: a phone shows the narrow drawing (style.py), where the wide one would be shrunk
    # to half its size; the first is the one "Download chart PNG" saves.
    return f'<div class="chart-wide">{drawn[WIDE]}</div><div class="chart-narrow">{drawn[NARROW]}</div>'


class LeaderboardTab:
    """The tab's components and events: the standings are read when it opens and each time it is
    selected again (a Compare vote changes them), or with Refresh."""

    def __init__(self, standings: Standings, admins: Admins, demo: gr.Blocks, page: gr.Tab) -> None:
        self.standings, self.admins = standings, admins
        gr.Markdown(INTRO, elem_id="leaderboard-intro")
        with gr.Accordion("How the ranking works", open=False, elem_id="leaderboard-how"):
            gr.Markdown(HOW, elem_id="leaderboard-method")
        with gr.Row():
            self.include_revealed = gr.Checkbox(label="Also count votes cast after the names were shown", value=False,
                                                elem_id="leaderboard-revealed", scale=3, interactive=True)
            self.refresh_button = gr.Button("Refresh", size="sm", scale=1, elem_id="leaderboard-refresh")
        self.summary = gr.Markdown(EMPTY, elem_id="leaderboard-summary")
        self.table = Table(pd.DataFrame(columns=COLUMNS), label="Ranking", elem_id="leaderboard-table")
        self.chart = gr.HTML("", elem_id="leaderboard-chart")
        with gr.Row():
            self.downloads = [gr.DownloadButton(f"Download {label}", interactive=False, size="sm",
                                                elem_id=f"leaderboard-export-{what}-{ext}") for what, ext, label in DOWNLOADS]
            save = gr.Button("Download chart PNG", size="sm", elem_id="leaderboard-png")
        save.click(None, js=save_png_js("leaderboard-chart", "leaderboard.png"))
        with gr.Row(visible=False, elem_id="leaderboard-admin") as self.admin_row:
            self.admin_downloads = [gr.DownloadButton(f"Download {label}", interactive=False, size="sm",
                                                      elem_id=f"leaderboard-export-{what}-{ext}")
                                    for what, ext, label in ADMIN_DOWNLOADS]
            self.reset = gr.Button("Reset all votes", variant="stop", size="sm", elem_id="leaderboard-reset")
            self.confirm = gr.Button("Yes, delete every vote", variant="stop", size="sm", visible=False,
                                     elem_id="leaderboard-reset-confirm")
            self.cancel = gr.Button("Keep them", size="sm", visible=False, elem_id="leaderboard-reset-cancel")
        self.status = gr.Markdown(elem_id="leaderboard-status")
        quick = {"api_visibility": "undocumented", "show_progress": "hidden", "concurrency_limit": None}
        for trigger in (demo.load, page.select, self.refresh_button.click, self.include_revealed.change):
            trigger(self.refresh, [self.include_revealed], self.outputs, **quick)
        self.reset.click(self.ask, None, [self.reset, self.confirm, self.cancel, self.status], **quick)
        self.cancel.click(self.keep, None, [self.reset, self.confirm, self.cancel, self.status], **quick)
        self.confirm.click(self.delete, [self.include_revealed], [*self.outputs, self.reset, self.confirm, self.cancel],
                           **quick)
        if admins.anyone_can_be:
            demo.load(self.show_admin, None, [self.admin_row], queue=False, api_visibility="private",
                      show_progress="hidden")

    @property
    def outputs(self) -> list[Any]:
        return [self.summary, self.table, self.chart, *self.downloads, *self.admin_downloads, self.status]

    async def refresh(self, include_revealed: bool = False, request: gr.Request | None = None) -> dict[Any, Any]:
        view = await self.standings.view(bool(include_revealed))
        out: dict[Any, Any] = {self.summary: summary(view, bool(include_revealed)), self.table: table(view.board),
                               self.chart: chart(view.board), self.status: ""}
        admin = request is not None and self.admins.allows_request(request)
        offered = [*zip(DOWNLOADS, self.downloads, strict=True),
                   *zip(ADMIN_DOWNLOADS, self.admin_downloads, strict=True)]
        for (what, ext, _), button in offered:
            path = view.files.get((what, ext)) if what == "leaderboard" or admin else None
            out[button] = gr.DownloadButton(value=str(path) if path else None, interactive=path is not None)
        return out

    def show_admin(self, request: gr.Request) -> Any:
        return gr.Row(visible=self.admins.allows_request(request))

    def ask(self, request: gr.Request) -> dict[Any, Any]:
        if not self.admins.allows_request(request):
            return {self.status: f"{PROBLEM} {NOT_ADMIN}"}
        return {self.reset: gr.Button(visible=False), self.confirm: gr.Button(visible=True),
                self.cancel: gr.Button(visible=True),
                self.status: "This deletes every stored vote for everyone, and cannot be undone. Download them first if you need them."}

    def keep(self) -> dict[Any, Any]:
        return {self.reset: gr.Button(visible=True), self.confirm: gr.Button(visible=False),
                self.cancel: gr.Button(visible=False), self.status: ""}

    async def delete(self, include_revealed: bool, request: gr.Request) -> dict[Any, Any]:
        if not self.admins.allows_request(request):  # checked again: an event can be sent without the page
            return {self.status: f"{PROBLEM} {NOT_ADMIN}"}
        deleted = await self.standings.reset()
        out = await self.refresh(include_revealed, request)
        return {**out, **self.keep(), self.status: f"Deleted {deleted:,} vote{'s' if deleted != 1 else ''}."}

def leaderboard_tab(standings: Standings, admins: Admins, demo: gr.Blocks, page: gr.Tab) -> LeaderboardTab:
    return LeaderboardTab(standings, admins, demo, page)


async def leaderboard_data(standings: Standings, include_revealed: bool = False) -> dict[str, Any]:
    """What `/leaderboard` answers."""
    view = await standings.view(bool(include_revealed))
    return {**view.board.as_dict(), "votes_stored": view.votes}


def leaderboard_api(standings: Standings) -> None:
    """`/leaderboard` for programs (with the page, not with the tab: chat/ui/lazy.py)."""

    async def leaderboard(include_revealed: bool = False) -> dict[str, Any]:
        """The leaderboard as data: standings best first (rating, 95% interval, votes, win rate,
        median first token and tokens/s), votes counted and left out, and the method."""
        return await leaderboard_data(standings, include_revealed)

    gr.api(leaderboard, api_name="leaderboard", concurrency_limit=None)
