"""The GPU probe: which devices training would see, their compute capability and native bf16.

Cheap checks first: without an NVIDIA driver on the machine, neither NVML nor torch is imported, so
`check` on a CPU runner starts fast. NVML (nvidia-ml-py, the `gpu` extra) is the fast path; torch is
the fallback, and it is what training will see. `torch.cuda.is_bf16_supported()` is never trusted:
with its default `including_emulation=True` it says True on a T4 or V100 (facts.md section 3).
"""

from __future__ import annotations

import importlib
import os
import platform as platform_mod
import sys
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from gemma_doctor import gpus
from gemma_doctor.units import positive_int
from gemma_doctor.gpus import cuda_native_bf16, emulation_trap, format_cc

# Where an NVIDIA driver leaves traces; any one is enough to make asking NVML/torch worth the import.
_DRIVER_PATHS = (
    "/proc/driver/nvidia/version",
    "/dev/nvidiactl",
    "/usr/lib/wsl/lib/libnvidia-ml.so.1",
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
    "/usr/lib64/libnvidia-ml.so.1",
    "/usr/lib/libnvidia-ml.so.1",
    "C:\\Windows\\System32\\nvml.dll",
)
_KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"


@dataclass(frozen=True)
class GpuDevice:
    """One visible GPU."""

    index: int
    name: str
    compute_capability: tuple[int, int] | None
    memory_bytes: int | None
    native_bf16: bool | None
    arch: str | None = None  # gfx target on ROCm, chip on Apple silicon

    @property
    def label(self) -> str:
        """"Tesla T4 (sm_75)", "MI300X (gfx942)"."""
        cc = self.compute_capability
        extra = f"sm_{cc[0]}{cc[1]}" if cc else self.arch
        return f"{self.name} ({extra})" if extra and extra not in self.name else self.name

    def to_json(self) -> dict[str, Any]:
        """The device as it appears under environment.gpu.devices."""
        return {"index": self.index, "name": self.name, "compute_capability": format_cc(self.compute_capability),
                "memory_bytes": self.memory_bytes, "native_bf16": self.native_bf16, "arch": self.arch}


@dataclass(frozen=True)
class GpuFacts:
    """The GPUs a training run would use (probed here, or planned with --gpu); the weakest decides."""

    devices: tuple[GpuDevice, ...]
    native_bf16: bool | None
    source: str  # "probe" | "--gpu"
    backend: str  # "cuda" | "rocm" | "mps" | "none"
    reason: str
    emulated_bf16_trap: bool = False
    via: str = "none"  # nvml | torch | sysfs | sysctl | --gpu | none
    driver: str | None = None
    spec: str | None = None
    # A planned GPU's memory as --gpu named it (gpus.GpuPlan), parsed once here for every later reader: why the size
    # is what it is ("A100 ships with 40 or 80 GB: planned for 40"), and what the memory plan assumes for a name sold
    # in several sizes. Not in the JSON block: the memory plan's assumptions print the note.
    memory_note: str = ""
    assumed_memory_bytes: int | None = None
    # How many of these GPUs the run uses and over how many machines, where an option or the training config says
    # (--num-gpus; num_processes / num_machines): for_options() fills them in. Not in the JSON block: the memory plan's
    # run states them with their sources.
    num_gpus: int | None = None
    num_nodes: int = 1

    @property
    def count(self) -> int:
        """The GPUs the run uses: as said (--num-gpus, the training config), else every device visible (at least one)."""
        return self.num_gpus or max(1, len(self.devices))

    @property
    def weakest(self) -> GpuDevice | None:
        """The device that decides: no native bf16 first, then the lowest compute capability."""
        if not self.devices:
            return None
        rank = {False: 0, None: 1, True: 2}
        return min(self.devices, key=lambda d: (rank[d.native_bf16], d.compute_capability or (99, 0)))

    @property
    def label(self) -> str:
        """"Tesla T4 (sm_75)", "2 x A100 (sm_80)", "no GPU"."""
        w = self.weakest
        if w is None:
            return "no GPU"
        names = {d.label for d in self.devices}
        if len(self.devices) > 1:
            return f"{len(self.devices)} x {w.label}" if len(names) == 1 else f"{len(self.devices)} GPUs, weakest {w.label}"
        return w.label

    def to_json(self) -> dict[str, Any]:
        """The `environment.gpu` block of the JSON report."""
        return {"source": self.source, "spec": self.spec, "backend": self.backend, "via": self.via,
                "driver": self.driver, "native_bf16": self.native_bf16, "emulated_bf16_trap": self.emulated_bf16_trap,
                "label": self.label, "reason": self.reason, "devices": [d.to_json() for d in self.devices]}


def combine(devices: tuple[GpuDevice, ...] | list[GpuDevice], backend: str, source: str, via: str,
            reason: str = "", driver: str | None = None, spec: str | None = None, trap: bool | None = None) -> GpuFacts:
    """GpuFacts of ``devices``: with several GPUs the weakest decides native bf16 (and the trap)."""
    devices = tuple(devices)
    if not devices:
        return GpuFacts((), False if backend == "none" else None, source, backend, reason, False, via, driver, spec)
    flags = [d.native_bf16 for d in devices]
    native: bool | None = False if False in flags else (None if None in flags else True)
    if trap is None:
        trap = any(emulation_trap(backend, d.native_bf16) for d in devices)
    if not reason:
        w = min(devices, key=lambda d: ({False: 0, None: 1, True: 2}[d.native_bf16], d.compute_capability or (99, 0)))
        many = f"{len(devices)} GPUs, the weakest is " if len(devices) > 1 else ""
        if native is True:
            reason = f"{many}{w.label}: native bf16"
        elif native is False:
            need = " (needs compute capability 8.0+)" if backend == "cuda" else ""
            reason = f"{many}{w.label}: no native bf16{need}"
        else:
            reason = f"{many}{w.label}: bf16 capability unknown"
    return GpuFacts(devices, native, source, backend, reason, bool(trap), via, driver, spec)


def no_gpu(reason: str, source: str = "probe", spec: str | None = None, via: str = "none",
           backend: str = "none", driver: str | None = None) -> GpuFacts:
    """The normal answer on a machine without a usable GPU."""
    return GpuFacts((), False if backend == "none" else None, source, backend, reason, False, via, driver, spec)


# --- --gpu -------------------------------------------------------------------------------------

def from_plan(plan: gpus.GpuPlan) -> GpuFacts:
    """GpuFacts for a planned machine (--gpu)."""
    if plan.backend == "none":
        return no_gpu(f"--gpu {plan.spec}: planning for training without a GPU", source="--gpu", spec=plan.spec, via="--gpu")
    dev = GpuDevice(0, plan.name or plan.label, plan.compute_capability, plan.memory_bytes, plan.native_bf16,
                    arch=plan.note.split()[0] if plan.backend == "rocm" and plan.note else None)
    facts = combine([dev], plan.backend, "--gpu", "--gpu", spec=plan.spec)
    return GpuFacts(facts.devices, facts.native_bf16, facts.source, facts.backend, f"--gpu {plan.spec}: {facts.reason}",
                    facts.emulated_bf16_trap, facts.via, None, plan.spec, plan.memory_note, plan.assumed_memory_bytes)


def planned(spec: str) -> GpuFacts:
    """Facts of the GPU ``spec`` names as --gpu does (UsageError when it names none): the one reading of a spec that
    check, recommend and the Python API share."""
    return from_plan(gpus.parse_gpu_spec(spec))


def resolve(spec: str | None) -> GpuFacts:
    """Facts of the GPU to plan for: ``spec`` as given to --gpu, or (None) this machine's probe."""
    if spec is None:
        return probe()
    return planned(spec)


# --- the probe ---------------------------------------------------------------------------------

def nvidia_driver_present(paths: tuple[str, ...] = _DRIVER_PATHS) -> bool:
    """True when this machine shows an NVIDIA driver; costs a few stat() calls, imports nothing."""
    if any(os.path.exists(p) for p in paths):
        return True
    return _on_path("nvidia-smi")


def _on_path(name: str) -> bool:
    """``shutil.which(name) is not None``, without importing shutil (and bz2, lzma, fnmatch with it: 2 ms of
    check's start-up on a machine without a driver) for this one look-up; Windows (PATHEXT) asks shutil itself."""
    if os.name == "nt":
        import shutil

        return shutil.which(name) is not None
    path = os.environ.get("PATH")
    if path is None:  # as shutil.which: the system's default search path
        try:
            path = os.confstr("CS_PATH")
        except (AttributeError, ValueError):
            path = os.defpath
    return bool(path) and any(os.access(f, os.F_OK | os.X_OK) and not os.path.isdir(f)
                              for f in (os.path.join(d, name) for d in path.split(os.pathsep)))


def rocm_present() -> bool:
    """True when the AMD kernel driver (KFD) is loaded."""
    return os.path.exists("/dev/kfd") and os.path.isdir(_KFD_NODES)


def _import(name: str) -> Any | None:
    try:
        return importlib.import_module(name)
    except Exception:  # not installed, or broken (a CUDA torch without its libraries): not a crash
        return None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# No __eq__/__hash__/__repr__ made: never compared, hashed or shown (each made method costs start-up time).
@dataclass(frozen=True, eq=False, repr=False)
class _Raw:
    name: str
    cc: tuple[int, int] | None
    memory: int | None
    uuid: str = ""


def select_visible(all_devices: list[_Raw], visible: str | None, pci_order: bool) -> list[tuple[int, _Raw]] | None:
    """The devices CUDA_VISIBLE_DEVICES leaves visible, in CUDA order; None when NVML cannot tell which.

    CUDA reads the list up to the first invalid entry. Integer entries count in CUDA's order, which is
    "fastest first" unless CUDA_DEVICE_ORDER=PCI_BUS_ID; NVML counts in PCI order, so on a machine with
    different GPUs only the PCI order (or UUIDs) lets NVML answer.
    """
    if visible is None:
        return list(enumerate(all_devices))
    homogeneous = len({(d.name, d.cc) for d in all_devices}) <= 1
    out: list[tuple[int, _Raw]] = []
    for token in (t.strip() for t in visible.split(",")):
        if not token:
            break
        digits = token.lstrip("-")
        if digits.isascii() and digits.isdigit():  # not "²", which isdigit() accepts and int() refuses
            i = int(token)
            if i < 0 or i >= len(all_devices):
                break
            if not homogeneous and not pci_order:
                return None
            out.append((i, all_devices[i]))
        elif token.upper().startswith("GPU-"):
            hits = [(i, d) for i, d in enumerate(all_devices) if d.uuid.lower().startswith(token.lower())]
            if len(hits) != 1:
                break
            out.append(hits[0])
        elif token.upper().startswith("MIG-"):
            # A MIG slice has its parent's compute capability; NVML cannot name the parent cheaply.
            if not homogeneous or not all_devices:
                return None
            out.append((0, all_devices[0]))
        else:
            break
    return out


def _devices(selected: list[tuple[int, _Raw]]) -> list[GpuDevice]:
    return [GpuDevice(n, d.name, d.cc, d.memory, cuda_native_bf16(d.cc)) for n, (_, d) in enumerate(selected)]


def probe_nvml(nvml: Any, environ: Mapping[str, str]) -> GpuFacts | None:
    """Ask NVML; None when it cannot answer (the caller then asks torch)."""
    try:
        nvml.nvmlInit()
    except Exception:
        return None
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        raw: list[_Raw] = []
        for i in range(int(nvml.nvmlDeviceGetCount())):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(h)
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(h))
            except Exception:
                uuid = ""
            raw.append(_Raw(_text(nvml.nvmlDeviceGetName(h)), (int(major), int(minor)),
                            int(nvml.nvmlDeviceGetMemoryInfo(h).total), uuid))
    except Exception:
        return None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    selected = select_visible(raw, visible, environ.get("CUDA_DEVICE_ORDER", "") == "PCI_BUS_ID")
    if selected is None:
        return None
    if not selected:
        why = f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU" if raw else "the NVIDIA driver reports no GPU"
        return no_gpu(f"no CUDA device: {why}", via="nvml", driver=driver)
    return combine(_devices(selected), "cuda", "probe", "nvml", driver=driver)


def probe_torch(torch: Any) -> GpuFacts:
    """Ask torch (what training will see); reads properties, never is_bf16_supported()."""
    version = getattr(torch, "__version__", "?")
    hip = getattr(getattr(torch, "version", None), "hip", None)
    backend = "rocm" if hip else "cuda"
    try:
        available = bool(torch.cuda.is_available())
        count = int(torch.cuda.device_count()) if available else 0
    except Exception as e:  # a driver/runtime mismatch is an answer, not a crash
        return no_gpu(f"no CUDA device: torch {version} cannot use the GPU ({type(e).__name__}: {e})".splitlines()[0], via="torch")
    if not count:
        build = "" if getattr(torch.version, "cuda", None) or hip else " (a CPU-only build)"
        return no_gpu(f"no CUDA device: torch {version}{build} sees no GPU", via="torch")
    devices: list[GpuDevice] = []
    for i in range(count):
        p = torch.cuda.get_device_properties(i)
        if backend == "rocm":
            arch = str(getattr(p, "gcnArchName", "") or "").split(":")[0] or None
            devices.append(GpuDevice(i, str(p.name), None, int(p.total_memory), rocm_native_bf16(arch), arch))
        else:
            cc = (int(p.major), int(p.minor))
            devices.append(GpuDevice(i, str(p.name), cc, int(p.total_memory), cuda_native_bf16(cc)))
    return combine(devices, backend, "probe", "torch")


def rocm_native_bf16(arch: str | None) -> bool | None:
    """Native bf16 on an AMD GPU: CDNA (MI100+) and RDNA3+ have bf16 matrix instructions; older ones do not."""
    if not arch:
        return None
    a = arch.lower()
    if a in ("gfx908", "gfx90a") or a.startswith(("gfx94", "gfx95", "gfx11", "gfx12")):
        return True
    if a in ("gfx900", "gfx906") or a.startswith(("gfx10", "gfx8")):
        return False
    return None


def probe_kfd(environ: Mapping[str, str], nodes_dir: str = _KFD_NODES) -> GpuFacts:
    """AMD GPUs from the KFD topology in sysfs (no torch): gfx_target_version names the architecture."""
    import glob  # an AMD machine only: check's start-up elsewhere does without it

    gpus_found: list[str] = []
    for node in sorted(glob.glob(os.path.join(nodes_dir, "*")), key=lambda p: int(os.path.basename(p)) if os.path.basename(p).isdigit() else 0):
        try:
            with open(os.path.join(node, "properties"), encoding="ascii", errors="replace") as f:
                props = dict(line.split(None, 1) for line in f if " " in line.strip())
        except OSError:
            continue
        v = int(props.get("gfx_target_version", "0").strip() or 0)
        if v:
            gpus_found.append(f"gfx{v // 10000}{(v // 100) % 100:x}{v % 100:x}")
    visible = next((environ[k] for k in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES") if k in environ), None)
    raw = [_Raw(a, None, None) for a in gpus_found]
    selected = select_visible(raw, visible, True) if visible is not None else list(enumerate(raw))
    if not selected:
        return no_gpu("no GPU: the ROCm driver is loaded but no GPU is visible", via="sysfs")
    devices = [GpuDevice(n, f"AMD {d.name}", None, None, rocm_native_bf16(d.name), d.name) for n, (_, d) in enumerate(selected)]
    return combine(devices, "rocm", "probe", "sysfs")


def probe_mps(mac_version: str, chip: str) -> GpuFacts:
    """Apple silicon: bf16 on MPS needs macOS 14+, and M1/M2 emulate it (facts.md section 3)."""
    try:
        major = int(mac_version.split(".")[0])
    except ValueError:
        major = 0
    known = gpus.lookup(chip.replace("Apple", "").split()[0] if chip.strip() else "")
    name = chip.strip() or "Apple GPU"
    if major and major < 14:
        dev = GpuDevice(0, name, None, None, False, "mps")
        return combine([dev], "mps", "probe", "sysctl", f"{name}, macOS {mac_version}: no bf16 on MPS before macOS 14", trap=False)
    native = known.native_bf16 if known is not None and known.backend == "mps" else None
    dev = GpuDevice(0, name, None, None, native, "mps")
    if native is False:
        why = f"{name}: MPS emulates bf16 (M1/M2); transformers' is_torch_bf16_gpu_available() still says True on macOS 14+"
    elif native:
        why = f"{name}, macOS {mac_version}: native bf16 on MPS"
    else:
        why = f"{name}, macOS {mac_version}: bf16 capability on MPS unknown for this chip"
    return combine([dev], "mps", "probe", "sysctl", why, trap=native is False)


def _mac_chip() -> str:
    import subprocess  # macOS only: check's start-up on other machines does without it

    try:
        return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                              timeout=5).stdout.strip()
    except Exception:
        return ""


def probe(environ: Mapping[str, str] | None = None, *, system: str | None = None,
          driver_present: Callable[[], bool] | None = None, load: Callable[[str], Any | None] | None = None) -> GpuFacts:
    """Probe this machine's GPUs as training would see them; never raises.

    The keyword arguments exist for tests (there is no GPU in CI): ``load`` imports a module by name
    (pynvml, torch) and returns None when it is not installed.
    """
    env = os.environ if environ is None else environ
    system = system or sys.platform
    load = load or _import
    try:
        if system == "darwin":
            if platform_mod.machine() != "arm64":
                return no_gpu("no CUDA device: an Intel Mac (gemma-doctor only knows Apple-silicon MPS)")
            return probe_mps(platform_mod.mac_ver()[0], _mac_chip())
        if (driver_present or nvidia_driver_present)():
            nvml = load("pynvml")
            if nvml is not None:
                facts = probe_nvml(nvml, env)
                if facts is not None:
                    return facts
            torch = load("torch")
            if torch is not None:
                return probe_torch(torch)
            return GpuFacts((), None, "probe", "cuda",
                            "an NVIDIA driver is present but neither nvidia-ml-py nor torch is installed to ask it "
                            "(pip install 'gemma-doctor[gpu]')", False, "none")
        if rocm_present():
            return probe_kfd(env)
        return no_gpu("no CUDA device: no NVIDIA driver on this machine (pass --gpu to plan for another one)")
    except Exception as e:  # the probe informs; it must never take `check` down
        return GpuFacts((), None, "probe", "none", f"GPU probe failed: {type(e).__name__}: {e}".splitlines()[0], False, "none")


# --- the run's GPU -------------------------------------------------------------------------------

def for_options(options: Any, training_config: Any | None = None, facts: GpuFacts | None = None) -> GpuFacts:
    """The run's GPU: resolve(options.gpu) (``facts``, where the caller resolved it already) with the count and nodes
    the options and the training config say, in the run's precedence (--num-gpus, then the config's num_processes; the
    config's num_machines). Made once per run by pipeline.environment(), which hands it on in Environment.gpu; nothing
    is kept here, so a later run probes afresh."""
    facts = facts if facts is not None else resolve(getattr(options, "gpu", None))
    memory = getattr(options, "memory", None)
    settings = training_config.settings if training_config is not None and getattr(training_config, "ok", False) else {}
    count = positive_int(getattr(memory, "num_gpus", None)) or _setting(settings, "num_processes")
    nodes = _setting(settings, "num_machines") or 1
    if count is None and nodes == 1:
        return facts
    return dataclasses.replace(facts, num_gpus=count, num_nodes=nodes)


def _setting(settings: Mapping[str, Any], name: str) -> int | None:
    setting = settings.get(name)
    return positive_int(setting.value) if setting is not None else None
