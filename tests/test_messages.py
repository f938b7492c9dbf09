"""How a reply being written looks in Gradio's own copy (chat/ui/messages.py)."""

from __future__ import annotations

import pytest

from chat.ui.messages import NO_TEXT_YET, live_body, settled_copy

HELD_BACK = [  # (the text so far, what Gradio's copy shows of it)
    ("Sure:\n```python", "Sure:\n"),  # Gradio draws this fence as text: "Sure:<br>```python"
    ("```py", ""),
    ("Here:\n| Name | Value |", "Here:\n"),  # a table row before its delimiter row
    ("Steps:\n1.", "Steps:\n"),
    ("Steps:\n-", "Steps:\n"),
    ("1. The best way is **to plan", "1. The best way is **to plan**"),  # Gradio drew the two stars as text
    ("and to use `co", "and to use `co`"),
    ("a [link](https://exam", "a "),
    ("a half-typed **", "a half-typed "),
    ("| a | b |\n|---", ""),  # a table before its delimiter row is whole
]


KEPT = [  # (the text so far, shown whole)
    ("Sure:\n```python\ndef add(a, b):", "Sure:\n```python\ndef add(a, b):"),  # the fence's line has ended
    ("Steps:\n- first", "Steps:\n- first"),  # a list item already
    ("Steps:\n\u0663.", "Steps:\n\u0663."),  # an Arabic-Indic 3 is no list marker (ASCII digits only, in both)
    ("One line, still growing", "One line, still growing"),
    ("", ""),
]


@pytest.mark.parametrize(("text", "copy"), [*HELD_BACK, *KEPT])
def test_the_copy_of_a_reply_being_written_is_settled_as_the_page_s_box_draws_it(text, copy):
    assert settled_copy(text) == copy


def test_a_reply_with_nothing_to_show_yet_says_so_to_screen_readers():
    assert live_body("live-1", "```py").endswith(NO_TEXT_YET)
    assert live_body("live-1", "Sure:\n```python").startswith('<div class="live-reply stream-live-1"></div>\n\nSure:\n')

