"""The redraw budget that Gradio's redraws of every streaming reply share (chat/pacing.py)."""

from __future__ import annotations

import pytest

from chat.pacing import RedrawPacer


def test_the_redraw_interval_stretches_with_the_number_of_replies_streaming():
    pacer = RedrawPacer(floor_s=0.04, max_per_s=100)
    assert pacer.interval() == 0.04
    for _ in range(50):
        pacer.started()
    assert pacer.interval() == pytest.approx(0.5)  # 50 replies share 100 redraws a second
    for _ in range(60):
        pacer.ended()
    assert pacer.streaming == 0 and pacer.interval() == 0.04
    assert RedrawPacer(floor_s=0.04, max_per_s=0).interval() == 0.04  # no budget
