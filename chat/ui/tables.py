"""Read-only tables (the Leaderboard's ranking, Compare's summary) as plain HTML tables, readable on
a phone without sideways scrolling.

Gradio's Dataframe sizes its columns in script and places each row itself, so on a 390 px screen a
nine-column table scrolls sideways inside its box (the Leaderboard showed Rank and Preset only), and
CSS cannot reflow it. A `Table` is an HTML table: a table on a wide screen, and on a narrow one (the
page's CSS, chat/ui/style.py) one card per row with each value beside its column's name.
"""

from __future__ import annotations

import html
import math
import numbers
from typing import Any

import gradio as gr
import pandas as pd


def cell_text(value: Any) -> str:
    """A cell as the Dataframe showed it: nothing for a missing value, 412 rather than 412.0."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def html_table(frame: pd.DataFrame, *, label: str, empty: str = "") -> str:
    """`frame` as an HTML table named `label` for screen readers; `empty` in one row when it has none.
    Roles are explicit: a phone shows the table's parts as blocks, which may otherwise drop them."""
    columns = [str(column) for column in frame.columns]
    head = "".join(f'<th role="columnheader" scope="col">{html.escape(column)}</th>' for column in columns)
    rows = []
    for values in frame.itertuples(index=False):
        cells = []
        for column, value in zip(columns, values, strict=True):
            numeric = isinstance(value, numbers.Number) and not isinstance(value, bool)
            klass = ' class="number"' if numeric else ""
            cells.append(f'<td role="cell" data-label="{html.escape(column)}"{klass}>{html.escape(cell_text(value))}</td>')
        rows.append(f'<tr role="row">{"".join(cells)}</tr>')
    if not rows and empty:
        rows.append(f'<tr role="row" class="empty"><td role="cell" colspan="{len(columns)}">{html.escape(empty)}</td></tr>')
    return (f'<table class="plain-table" role="table" aria-label="{html.escape(label)}">'
            f'<thead role="rowgroup"><tr role="row">{head}</tr></thead>'
            f'<tbody role="rowgroup">{"".join(rows)}</tbody></table>')


class Table(gr.HTML):
    """An HTML component that takes a pandas DataFrame, as gr.Dataframe does, and shows it as a
    plain table (`html_table`). Gradio draws it as its own HTML component."""

    def __init__(self, value: pd.DataFrame | None = None, *, label: str, empty: str = "", **kwargs: Any) -> None:
        self.table_label, self.empty = label, empty  # before Gradio's __init__ runs postprocess
        super().__init__(value, label=label, js_on_load=None, apply_default_css=False, **kwargs)

    def postprocess(self, value: pd.DataFrame | str | None) -> str | None:
        if isinstance(value, pd.DataFrame):
            return html_table(value, label=self.table_label, empty=self.empty)
        return value
