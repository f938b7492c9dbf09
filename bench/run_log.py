"""A timed benchmark call's record, for bench/gpu.py and bench/gpu_ops.py: a GPU host lends them a
fixed time, so every step is saved as it ends and none starts after the deadline.

    log = RunLog(out, result, deadline=520.0, t_start=time.monotonic())
    log.event("raw engine ready")     # printed as '[  12.3s] raw engine ready' and kept in result["events"]
    log.save()                        # the result so far, as JSON
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class RunLog:
    out: Path
    result: dict[str, Any]  # what goes to `out`; needs an "events" list
    deadline: float  # seconds after t_start
    t_start: float  # time.monotonic() when the call began

    def left(self) -> float:
        """Seconds until the deadline."""
        return self.deadline - (time.monotonic() - self.t_start)

    def event(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t_start:6.1f}s] {text}"
        print(line, flush=True)
        self.result["events"].append(line)

    def save(self) -> None:
        self.out.write_text(json.dumps(self.result, indent=1, default=str))
