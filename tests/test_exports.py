"""Files people download: cells a spreadsheet will not run, written as text (chat/exports.py)."""

from __future__ import annotations

import pytest

from chat.exports import spreadsheet_safe, write_texts

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text", ["=1+1", "+1", "@SUM(A1)", "\t=1", "\r=1", "-2+3"])
def test_a_cell_a_spreadsheet_would_run_gets_a_quote(text):
    assert spreadsheet_safe(text) == "'" + text


@pytest.mark.parametrize("value", ["Hello", "- a list item", "-", "", 3, 2.5, None])
def test_everything_else_passes_as_it_is(value):
    assert spreadsheet_safe(value) == value


def test_texts_are_written_by_extension_into_a_new_folder(tmp_path):
    paths = write_texts(tmp_path / "new", "report", {"csv": "a,b\r\n", "json": "{}"})
    assert set(paths) == {"csv", "json"} and paths["csv"].name == "report.csv"
    assert paths["csv"].read_bytes() == b"a,b\r\n"  # newlines as given (csv writes its own)
