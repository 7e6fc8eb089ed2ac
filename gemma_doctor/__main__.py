"""Allow ``python -m gemma_doctor``."""

from __future__ import annotations

import sys


def _run() -> None:
    try:
        from gemma_doctor.cli import main
    except KeyboardInterrupt:
        # Ctrl-C while modules are still loading: nothing has been read or written yet. One line, no traceback.
        sys.stderr.write("gemma-doctor: interrupted before it started; nothing was changed\n")
        sys.exit(130)
    main()


if __name__ == "__main__":
    _run()
