"""A script that never ends: it writes its pid where the test says, then sleeps forever."""

import sys
import time
from pathlib import Path

Path(sys.argv[1]).write_text(str(__import__("os").getpid()))
while True:
    time.sleep(0.5)
