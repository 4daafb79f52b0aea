"""What a run reports as it goes: ``metrics.jsonl`` (one row per optimizer step and per evaluation, written by rank 0)
and one line per step and per evaluation on the log stream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable


class RunLog:
    """The metrics file (None on ranks other than 0) and the run's ``say``."""

    def __init__(self, path: Path | None, say: Callable[[str], None], total_steps: int):
        self.file = path.open("a") if path is not None else None
        self.say = say
        self.total_steps = total_steps

    def _write(self, row: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(row) + "\n")
            self.file.flush()

    def step(self, row: dict[str, Any]) -> None:
        """One optimizer step's row (``loop.StepStats.row``)."""
        self._write(row)
        acc = "n/a" if row["accuracy"] is None else f"{row['accuracy']:.2f}"
        margin = "n/a" if row["margin"] is None else f"{row['margin']:+.3f}"
        self.say(f"step {row['step']}/{self.total_steps} epoch {row['epoch']} loss {row['loss']:.4f} acc {acc} margin {margin} "
                 f"lr {row['lr']:.2e} ({row['seconds']:.0f} s)")

    def evaluation(self, step: int, ev: dict[str, Any]) -> None:
        """Held-out metrics after ``step`` (``report.evaluate.summarize``)."""
        self._write({"step": step, "eval": ev})
        acc = "n/a" if ev["accuracy"] is None else f"{ev['accuracy']:.4f}"
        margin = "n/a" if ev["mean_margin"] is None else f"{ev['mean_margin']:+.4f}"
        self.say(f"eval step {step}: accuracy {acc} over {ev['n']} pairs, mean margin {margin}")

    def close(self) -> None:
        """Close the metrics file."""
        if self.file is not None:
            self.file.close()
