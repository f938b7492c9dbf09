"""How often streaming replies are redrawn: a shared budget, so that many readers cannot swamp the server.

Every redraw costs the server the same work whatever it carries (Gradio rebuilds and diffs the
chat, serialises it, sends it), so what must be bounded is redraws per second across all replies,
not per reply. Each reply is redrawn at most once per `floor_s`; when more replies stream at once
than `max_per_s * floor_s`, each one's interval stretches so that together they stay within
`max_per_s`: text then arrives in bigger pieces instead of the server falling behind and every
reply stalling. The first text of a reply is always shown at once (chat.stream.paced).
"""

from __future__ import annotations

from dataclasses import dataclass

FLUSH_S = 0.04  # the default floor (--flush-ms)
MAX_REDRAWS_PER_S = 400.0  # the default budget across all replies (--max-redraws-per-s)


@dataclass
class RedrawPacer:
    floor_s: float = FLUSH_S
    max_per_s: float = MAX_REDRAWS_PER_S  # 0: no budget (every reply at floor_s)
    streaming: int = 0  # replies being redrawn now

    def started(self) -> None:
        self.streaming += 1

    def ended(self) -> None:
        self.streaming = max(self.streaming - 1, 0)

    def interval(self) -> float:
        """Seconds between two redraws of one reply, now."""
        if self.max_per_s <= 0:
            return self.floor_s
        return max(self.floor_s, self.streaming / self.max_per_s)
