"""A 2-rank script whose rank 1 never ends (tests/test_rehearse_ranks.py): each rank builds accelerate's Accelerator
from the launch's config (with `--cpu`-less FSDP settings a CPU cannot honour, it would stop here), writes its pid,
and rank 0 exits."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

if "--accelerator" in sys.argv:
    from accelerate import Accelerator

    Accelerator()
Path(sys.argv[1], f"rank{os.environ['RANK']}.pid").write_text(str(os.getpid()))
if os.environ["RANK"] == "1":
    time.sleep(3600)
