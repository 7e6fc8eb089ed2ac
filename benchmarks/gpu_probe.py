"""Print gemma-doctor's GPU probe next to what torch says, for recording on a real GPU (docs/precision.md).

    python benchmarks/gpu_probe.py            # JSON on stdout

On a T4 or V100 the interesting line is torch.cuda.is_bf16_supported() (True, through emulation)
against including_emulation=False and gemma-doctor's native_bf16 (both False).
"""

from __future__ import annotations

import json
import platform
import sys
import time


def main() -> int:
    """Probe, then ask torch, and print both with the time each took."""
    t0 = time.perf_counter()
    from gemma_doctor.readers.gpu import nvidia_driver_present, probe

    facts = probe()
    probe_s = time.perf_counter() - t0
    out: dict = {"python": platform.python_version(), "platform": sys.platform, "nvidia_driver_present": nvidia_driver_present(),
                 "gemma_doctor_probe": facts.to_json(), "probe_seconds": round(probe_s, 4),
                 "torch_imported_by_probe": "torch" in sys.modules}
    t1 = time.perf_counter()
    try:
        import torch
    except ImportError:
        out["torch"] = None
    else:
        info: dict = {"version": torch.__version__, "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
                      "import_seconds": round(time.perf_counter() - t1, 4), "cuda_available": torch.cuda.is_available()}
        if torch.cuda.is_available():
            info["devices"] = [{"name": torch.cuda.get_device_name(i),
                                "capability": ".".join(map(str, torch.cuda.get_device_capability(i)))}
                               for i in range(torch.cuda.device_count())]
            # The trap: the default (including_emulation=True) says True on pre-Ampere GPUs.
            info["is_bf16_supported()"] = torch.cuda.is_bf16_supported()
            try:
                info["is_bf16_supported(including_emulation=False)"] = torch.cuda.is_bf16_supported(including_emulation=False)
            except TypeError:  # torch < 2.4 has no such argument (and no emulation check)
                info["is_bf16_supported(including_emulation=False)"] = "n/a (torch < 2.4)"
        try:
            from transformers.utils import is_torch_bf16_gpu_available

            info["transformers.is_torch_bf16_gpu_available()"] = is_torch_bf16_gpu_available()
        except Exception as e:  # transformers absent or too old
            info["transformers.is_torch_bf16_gpu_available()"] = f"n/a ({type(e).__name__})"
        out["torch"] = info
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
