"""The rows a rehearsal trains on when the user's dataset is not local: synthetic chat rows, and the first rows of a
local JSON Lines / JSON dataset. A leaf of the child's modules: the driver, the DPO run and the accumulation check
import it, not each other (tests/test_layers.py: no cycle).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROWS = [
    ("What is the capital of France?", "Paris is the capital of France."),
    ("Name a primary colour.", "Red is a primary colour."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("Translate 'thank you' to German.", "'Thank you' is 'danke' in German."),
    ("What is 7 times 6?", "7 times 6 is 42."),
    ("Give a synonym for 'quick'.", "'Fast' is a synonym for 'quick'."),
    ("Which planet is known as the red planet?", "Mars is known as the red planet."),
    ("What do bees make?", "Bees make honey and wax."),
]


def _read_rows(path: Path, n: int) -> list[dict[str, Any]]:
    """The first ``n`` rows of a local JSON Lines / JSON dataset file (others: none, the synthetic rows are used)."""
    if path.suffix == ".jsonl":
        rows = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    rows.append(json.loads(line))
                if len(rows) >= n:
                    break
        return [r for r in rows if isinstance(r, dict)]
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        return [r for r in data[:n] if isinstance(r, dict)] if isinstance(data, list) else []
    return []
