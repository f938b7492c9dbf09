"""The Capacity tab (administrators only): how many simulated users a preset serves within a target.

The test itself is chat.capacity_run's (through the reply pipeline) and its numbers chat.capacity's;
this module draws the form, the progress, the table and the chart, and writes the exports. Every
event asks chat.admin again whether the person is an administrator: the tab is hidden from
everyone else, but an event can be sent without the page.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import gradio as gr
import pandas as pd

from chat.admin import NOT_ADMIN, Admins
from chat.capacity import (
    DEFAULT_TARGET_S,
    MAX_PROMPT_TOKENS,
    MAX_STEP_S,
    MAX_USERS,
    MIN_STEP_S,
    Metric,
    Report,
    make_plan,
    most_users,
)
from chat.capacity_run import CapacityLab, CapacityRun
from chat.charts import COLOURS, FAINT, Legend, Panel, Series, line_panels
from chat.errors import ChatError
from chat.service import ChatService
from chat.ui.components import PlainDropdown, PlainNumber, PlainSlider
from chat.ui.downloads import new_folder
from chat.ui.messages import PROBLEM
from chat.ui.svg_png import save_png_js

log = logging.getLogger(__name__)

INTRO = (
    "Simulated users send the same kind of prompt to a preset, each sending the next as soon as its reply "
    "ends: 1 user, then 2, 4, … up to the most you choose, for a set time each. You get each step's time to "
    "first token (median and 95th percentile), two speeds, and the most users for which your target still "
    "holds. The **writing speed per reply** is what a user sees while a reply is written (tokens/s after its "
    "first token, the median reply's); **all users together** counts every token of the step over its whole "
    "length, waits for first tokens included, so with one user it is lower than that user's writing speed. "
    "Visitors go first: the test never takes a quarter of the engine's slots, "
    "sends nothing new while a visitor waits, and its requests are served last where the preset uses "
    "priority scheduling. Everyone sees a note while a test runs."
)
NONE = "(none)"
SPEED_PER_REPLY = "Writing speed per reply (tokens/s, median)"
SPEED_TOTAL = "All users together (tokens/s over the step)"
COLUMNS = ["Preset", "Simulated users", "Meets target", "Median first token (ms)", "95th percentile first token (ms)",
           SPEED_PER_REPLY, SPEED_TOTAL, "Replies", "Failed"]


def table(report: Report) -> pd.DataFrame:
    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000)

    target = report.plan.target
    rows = [[s.preset, s.users, "yes" if target.met_by(s) else "no", ms(s.first_token_p50_s), ms(s.first_token_p95_s),
             None if s.tokens_per_s_per_user is None else round(s.tokens_per_s_per_user, 1),
             round(s.tokens_per_s_total, 1), s.finished + s.cut, s.failed]
            for s in report.steps]
    return pd.DataFrame(rows, columns=COLUMNS)


def chart(report: Report) -> str:
    """Three panels against the number of users; each preset in its own colour, the most users
    within the target circled, the target as a red dashed line where it applies."""
    target, steps = report.plan.target, report.steps
    if not steps:
        return ""
    xs = sorted({float(s.users) for s in steps})
    first: list[Series] = []
    speed: list[Series] = []
    total: list[Series] = []
    legend: list[tuple[str, str, bool]] = []
    for i, name in enumerate(report.plan.presets):
        mine = sorted((s for s in steps if s.preset == name), key=lambda s: s.users)
        colour = COLOURS[i % len(COLOURS)]
        best = most_users(mine, target)
        marked = (float(best),) if best is not None else ()

        def points(values: list[float | None], mine: list[Any] = mine) -> list[tuple[float, float | None]]:
            return [(float(s.users), v) for s, v in zip(mine, values, strict=True)]

        ms = [None if s.first_token_p95_s is None else s.first_token_p95_s * 1000 for s in mine]
        median = [None if s.first_token_p50_s is None else s.first_token_p50_s * 1000 for s in mine]
        first.append(Series(f"{name} 95th percentile", points(ms), colour,
                            marked=marked if target.metric is Metric.FIRST_TOKEN_P95 else ()))
        first.append(Series(f"{name} median", points(median), colour, dashed=True,
                            marked=marked if target.metric is Metric.FIRST_TOKEN_P50 else ()))
        speed.append(Series(name, points([s.tokens_per_s_per_user for s in mine]), colour,
                            marked=marked if target.metric is Metric.TOKENS_PER_S_PER_USER else ()))
        total.append(Series(name, points([s.tokens_per_s_total for s in mine]), colour))
        legend.append((name, colour, False))
    legend.append(("dashed: median first token · circled: most users within the target", FAINT, True))
    time_rule = target.limit * 1000 if target.metric.is_time else None
    panels = [
        Panel("Time to first token", "ms (solid: 95th percentile)", first, time_rule,
              f"target {time_rule:,.0f} ms" if time_rule else ""),
        Panel("Writing speed per reply", "tokens/s after the first token, median reply", speed,
              None if target.metric.is_time else target.limit, "" if target.metric.is_time else f"target {target.limit:g}"),
        Panel("All users together", "tokens/s over the whole step, waits included", total),
    ]
    return line_panels(panels, xs, title="Capacity: latency and speed against simulated users", x_title="simulated users",
                       legend=Legend(tuple(legend)), caption=[*report.caption(), *report.verdicts()])


def verdicts(report: Report) -> str:
    lines = [f"- {line}" for line in report.verdicts()] + [f"- {note}" for note in report.notes]
    return "\n".join(lines)


class CapacityTab:
    def __init__(self, service: ChatService, lab: CapacityLab, admins: Admins) -> None:
        self.service, self.lab, self.admins = service, lab, admins
        names = service.preset_names()
        gr.Markdown(INTRO, elem_id="capacity-intro")
        with gr.Row():
            self.preset = PlainDropdown(names, value=names[0], label="Preset", elem_id="capacity-preset")
            self.other = PlainDropdown([NONE, *names], value=NONE, label="Side by side with (optional)",
                                       elem_id="capacity-other")
        with gr.Row():
            self.users = PlainSlider(1, MAX_USERS, value=8, step=1, label="Most simulated users",
                                     info="Steps double from 1 up to this.", elem_id="capacity-users")
            self.step_s = PlainSlider(MIN_STEP_S, MAX_STEP_S, value=20, step=1, label="Seconds per step",
                                      info="Longer steps give steadier numbers.", elem_id="capacity-step")
            self.prompt_tokens = PlainSlider(8, MAX_PROMPT_TOKENS, value=64, step=8, label="Prompt length (tokens, about)",
                                             elem_id="capacity-prompt")
            self.reply_tokens = PlainSlider(2, 2048, value=64, step=2, label="Reply length (Max new tokens)",
                                            info="Within the preset's own limit.", elem_id="capacity-reply")
        with gr.Row():
            self.metric = PlainDropdown([m.value for m in Metric], value=Metric.FIRST_TOKEN_P95.value, label="Target",
                                        elem_id="capacity-metric")
            self.limit = PlainNumber(DEFAULT_TARGET_S * 1000, label="Target value",
                                     info="Milliseconds for a first-token time (stay under), tokens/s for a speed (stay above).",
                                     elem_id="capacity-limit")
        with gr.Row():
            self.run_button = gr.Button("Run the capacity test", variant="primary", elem_id="capacity-run")
            # Stop is for a running test only, and the chart's PNG for a drawn chart: both start disabled.
            self.stop_button = gr.Button("Stop", variant="stop", interactive=False, elem_id="capacity-stop")
        self.progress = gr.Markdown(elem_id="capacity-progress")
        self.verdicts = gr.Markdown(elem_id="capacity-verdicts")
        self.table = gr.Dataframe(pd.DataFrame(columns=COLUMNS), interactive=False, show_label=False,
                                  elem_id="capacity-table")
        self.chart = gr.HTML("", elem_id="capacity-chart")
        with gr.Row():
            self.csv = gr.DownloadButton("Download CSV", interactive=False, size="sm", elem_id="capacity-export-csv")
            self.json = gr.DownloadButton("Download JSON", interactive=False, size="sm", elem_id="capacity-export-json")
            self.save = gr.Button("Download chart PNG", size="sm", interactive=False, elem_id="capacity-png")
        self.save.click(None, js=save_png_js("capacity-chart", "capacity.png"))
        inputs = [self.preset, self.other, self.users, self.step_s, self.prompt_tokens, self.reply_tokens, self.metric,
                  self.limit]
        outputs = [self.progress, self.verdicts, self.table, self.chart, self.csv, self.json, self.stop_button, self.save]
        self.run_button.click(self.run, inputs, outputs, api_name="capacity", api_visibility="undocumented",
                              concurrency_limit=None, show_progress="hidden")
        self.stop_button.click(self.stop, None, [self.progress], api_name="capacity_stop", api_visibility="undocumented",
                               concurrency_limit=None, show_progress="hidden")

    async def run(self, request: gr.Request, preset: Any, other: Any, users: Any, step_s: Any, prompt_tokens: Any,
                  reply_tokens: Any, metric: Any, limit: Any) -> AsyncIterator[dict[Any, Any]]:
        """Run a test with these settings, yielding its progress, then the table, chart and exports."""
        if not self.admins.allows_request(request):
            yield {self.progress: f"{PROBLEM} {NOT_ADMIN}"}
            return
        presets = [preset] + ([other] if other not in (None, "", NONE) else [])
        try:
            plan = make_plan(presets, max_users=users, step_s=step_s, prompt_tokens=prompt_tokens,
                             reply_tokens=reply_tokens, metric=metric, limit=limit)
            run = await self.lab.begin(plan, by=request.username or "")
        except ChatError as exc:
            # Refused because a test already runs (here or in another worker): Stop can end that one.
            yield {self.progress: f"{PROBLEM} {exc.message}", self.stop_button: gr.Button(interactive=self.lab.busy())}
            return
        yield {self.progress: run.progress.line(), self.verdicts: "", self.table: pd.DataFrame(columns=COLUMNS),
               self.chart: "", self.csv: gr.DownloadButton(value=None, interactive=False),
               self.json: gr.DownloadButton(value=None, interactive=False),
               self.stop_button: gr.Button(interactive=True), self.save: gr.Button(interactive=False)}
        shown = 0
        try:
            async with contextlib.aclosing(run.run()) as progresses:  # closing the tab's turn stops the test
                async for progress in progresses:
                    update: dict[Any, Any] = {self.progress: progress.line()}
                    if len(run.steps) != shown:
                        shown = len(run.steps)
                        report = run.report()
                        drawn = chart(report)
                        update.update({self.table: table(report), self.chart: drawn, self.save: gr.Button(interactive=bool(drawn))})
                    yield update
        except Exception:
            log.exception("The capacity test failed")
            run.stop("stopped: something went wrong on the server (see its log)")
        yield self.finished(run)

    def finished(self, run: CapacityRun) -> dict[Any, Any]:
        report = run.report()
        drawn = chart(report)
        folder = new_folder("capacity")
        (folder / "capacity.csv").write_text(report.to_csv(), encoding="utf-8", newline="")
        (folder / "capacity.json").write_text(report.to_json(), encoding="utf-8")
        line = f"The capacity test {report.ended}: {len(report.steps)} step{'s' if len(report.steps) != 1 else ''} measured."
        return {self.progress: line if report.ended == "finished" or report.steps else f"{PROBLEM} The capacity test {report.ended}.",
                self.verdicts: verdicts(report), self.table: table(report), self.chart: drawn,
                self.csv: gr.DownloadButton(value=str(folder / "capacity.csv"), interactive=True),
                self.json: gr.DownloadButton(value=str(folder / "capacity.json"), interactive=True),
                self.stop_button: gr.Button(interactive=False), self.save: gr.Button(interactive=bool(drawn))}

    async def stop(self, request: gr.Request) -> str:  # async: stopping aborts on the server's event loop
        if not self.admins.allows_request(request):
            return f"{PROBLEM} {NOT_ADMIN}"
        if not await self.lab.stop():
            return "No capacity test is running."
        return "Stopping the capacity test: its requests are being aborted."


def capacity_tab(service: ChatService, lab: CapacityLab, admins: Admins) -> CapacityTab:
    return CapacityTab(service, lab, admins)
