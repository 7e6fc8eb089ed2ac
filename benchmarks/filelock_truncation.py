"""Does a filelock release truncate a file planted at the lock path (symlink, hard link)? Reproduces the table in
docs/reliability.md ("The lock"), which is why gemma-doctor takes its lock itself.

    pip download --no-deps filelock==3.12.0 -d /tmp/fl && unzip -q /tmp/fl/*.whl -d /tmp/fl/x
    PYTHONPATH=/tmp/fl/x python benchmarks/filelock_truncation.py

Prints one JSON line: the filelock version and, per kind of planted link, what became of the target's bytes.
"""

from __future__ import annotations

import json
import os
import tempfile


def main() -> None:
    import filelock

    out: dict[str, str] = {"filelock": filelock.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        victim = os.path.join(tmp, "victim")
        for kind, make in (("symlink", os.symlink), ("hard link", os.link)):
            with open(victim, "w") as f:
                f.write("precious")
            lock = os.path.join(tmp, f"{kind.replace(' ', '-')}.lock")
            make(victim, lock)
            try:
                with filelock.FileLock(lock, timeout=1):
                    pass
                outcome = None
            except OSError as e:
                outcome = f"refused ({e.strerror})"
            with open(victim) as f:
                left = f.read()
            out[kind] = outcome or ("target truncated" if left == "" else "target unchanged")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
