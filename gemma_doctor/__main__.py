"""Allow ``python -m gemma_doctor``."""

from __future__ import annotations

from gemma_doctor.cli import main

if __name__ == "__main__":
    main()
