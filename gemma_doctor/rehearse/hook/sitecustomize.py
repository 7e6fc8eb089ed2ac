"""Put on the PYTHONPATH of a `rehearse --launch` child only (gemma_doctor/rehearse/launch.py): every Python process
the user's command starts (the launcher's workers too) runs this first. It arms the Trainer probe
(gemma_doctor/rehearse/hook/probe.py) and then runs the environment's own sitecustomize, which this file shadows.
"""

from __future__ import annotations

import os


def _chain() -> None:
    """Run the sitecustomize this one shadows (a distribution's or a virtualenv's), as Python would have."""
    import importlib.machinery
    import importlib.util
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("GEMMA_DOCTOR_LAUNCH_PLAN"):
    try:
        from gemma_doctor.rehearse.hook import probe

        probe.arm(os.environ["GEMMA_DOCTOR_LAUNCH_PLAN"])
    except Exception as e:  # noqa: BLE001 - a probe that cannot arm must not stop the user's script; the parent says so
        import sys

        sys.stderr.write(f"gemma-doctor: the rehearsal's probe did not arm: {type(e).__name__}: {e}\n")
_chain()
