"""A launched rank that writes the compute threads it runs with (tests/test_rehearse_launch.py): torch's intra-op
threads and the OMP_NUM_THREADS its launcher gave it, into FOLDER/rank<RANK>.json."""

import json
import os
import sys
from pathlib import Path

import torch

rank = os.environ.get("RANK", "0")
Path(sys.argv[1], f"rank{rank}.json").write_text(json.dumps({
    "torch": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS")}))
