"""Pure GPU knowledge: compute capabilities of known GPUs, bf16 capability, and `--gpu` parsing.

Nothing here touches the machine; the probe of the GPUs actually present is readers/gpu.py.
Sources: facts.md section 3 (NVIDIA compute capabilities, MPS, the emulation trap).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gemma_doctor.errors import UsageError

# Native bf16 arithmetic (tensor cores) arrived with Ampere, compute capability 8.0. Older GPUs
# only emulate it through fp32, which torch.cuda.is_bf16_supported() counts as "supported".
NATIVE_BF16_MIN_CC = (8, 0)
GIB = 1024**3


@dataclass(frozen=True)
class KnownGpu:
    """One GPU model gemma-doctor can plan for by name."""

    name: str
    backend: str
    compute_capability: tuple[int, int] | None = None  # CUDA only
    memory_gib: int | None = None  # None where the model ships with several sizes (memory_options)
    native_bf16: bool | None = None  # for non-CUDA entries; CUDA entries derive it from the CC
    aliases: tuple[str, ...] = ()
    note: str = ""
    # The sizes a model ships with when there are several (A100 40/80 GB): a bare name plans for the smallest.
    memory_options: tuple[int, ...] = ()


def _nv(name: str, cc: tuple[int, int], mem: int | tuple[int, ...] | None = None, *aliases: str) -> KnownGpu:
    if isinstance(mem, tuple):
        return KnownGpu(name=name, backend="cuda", compute_capability=cc, memory_gib=None, aliases=aliases,
                        memory_options=mem)
    return KnownGpu(name=name, backend="cuda", compute_capability=cc, memory_gib=mem, aliases=aliases)


# NVIDIA compute capabilities as published at developer.nvidia.com/cuda-gpus (facts.md section 3
# lists the ones people fine-tune Gemma on). Memory is the common configuration.
KNOWN_GPUS: tuple[KnownGpu, ...] = (
    _nv("K80", (3, 7), 12),
    _nv("P4", (6, 1), 8),
    _nv("P40", (6, 1), 24),
    _nv("P100", (6, 0), 16),
    _nv("V100", (7, 0), (16, 32), "Titan V"),
    _nv("T4", (7, 5), 16),
    _nv("RTX 2080", (7, 5), 8),
    _nv("RTX 2080 Ti", (7, 5), 11),
    _nv("Quadro RTX 8000", (7, 5), 48, "RTX 8000"),
    _nv("Quadro RTX 6000", (7, 5), 24, "RTX 6000"),
    _nv("A100", (8, 0), (40, 80)),
    _nv("A30", (8, 0), 24),
    _nv("A10", (8, 6), 24),
    _nv("A10G", (8, 6), 24),
    _nv("A40", (8, 6), 48),
    _nv("RTX A6000", (8, 6), 48, "A6000"),
    _nv("RTX A5000", (8, 6), 24, "A5000"),
    _nv("RTX A4000", (8, 6), 16, "A4000"),
    _nv("RTX 3060", (8, 6), 12),
    _nv("RTX 3070", (8, 6), 8),
    _nv("RTX 3080", (8, 6), (10, 12)),
    _nv("RTX 3090", (8, 6), 24, "RTX 3090 Ti"),
    _nv("Jetson AGX Orin", (8, 7), (32, 64), "Orin"),
    _nv("L4", (8, 9), 24),
    _nv("L40", (8, 9), 48),
    _nv("L40S", (8, 9), 48),
    _nv("RTX 6000 Ada", (8, 9), 48),
    _nv("RTX 4060", (8, 9), 8),
    _nv("RTX 4070", (8, 9), 12),
    _nv("RTX 4080", (8, 9), 16),
    _nv("RTX 4090", (8, 9), 24),
    _nv("H100", (9, 0), (80, 94), "H800"),
    _nv("H200", (9, 0), 141),
    _nv("GH200", (9, 0), 96),
    _nv("B100", (10, 0), 192),
    _nv("B200", (10, 0), 180),
    _nv("GB200", (10, 0), 186),
    _nv("RTX 5080", (12, 0), 16),
    _nv("RTX 5090", (12, 0), 32),
    _nv("RTX PRO 6000", (12, 0), 96, "RTX PRO 6000 Blackwell"),
    # AMD Instinct: CDNA2/CDNA3 have bf16 matrix instructions. torch.cuda.is_bf16_supported()
    # returns True on every ROCm build without looking at the GPU (facts.md section 3).
    KnownGpu("MI250X", "rocm", None, 128, True, ("MI250",), "gfx90a"),
    KnownGpu("MI210", "rocm", None, 64, True, (), "gfx90a"),
    KnownGpu("MI300X", "rocm", None, 192, True, ("MI300",), "gfx942"),
    KnownGpu("MI325X", "rocm", None, 256, True, (), "gfx942"),
    # Apple silicon (MPS): bf16 needs macOS 14+, and M1/M2 emulate it (facts.md section 3).
    KnownGpu("M1", "mps", None, None, False, (), "M1 emulates bf16 on MPS"),
    KnownGpu("M2", "mps", None, None, False, (), "M2 emulates bf16 on MPS"),
    KnownGpu("M3", "mps", None, None, True, (), "native bf16 on MPS with macOS 14+"),
    KnownGpu("M4", "mps", None, None, True, (), "native bf16 on MPS with macOS 14+"),
)

ACCEPTED_FORMS = ("a compute capability (8.0, 7.5, sm_75, sm_120), a GPU name (T4, V100, A100, A10G, L4, L40S, "
                  "H100, H200, B200, RTX 3090, RTX 4090, RTX 2080 Ti, RTX 5090, MI300X, M2 ...) or none")

# Words in marketing names that do not tell GPUs apart ("NVIDIA GeForce RTX 4090" = "RTX 4090").
_NOISE = frozenset({"nvidia", "tesla", "geforce", "amd", "instinct", "apple", "radeon"})


def _tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[^a-z0-9]+", name.lower()) if t and t not in _NOISE]


def _norm(name: str) -> str:
    return "".join(_tokens(name))


def _index() -> dict[str, KnownGpu]:
    out: dict[str, KnownGpu] = {}
    for gpu in KNOWN_GPUS:
        for n in (gpu.name, *gpu.aliases):
            out[_norm(n)] = gpu
    return out


_BY_NAME = _index()


def cuda_native_bf16(cc: tuple[int, int] | None) -> bool | None:
    """Native bf16 on an NVIDIA GPU of compute capability ``cc`` (None when unknown)."""
    if cc is None:
        return None
    return tuple(cc) >= NATIVE_BF16_MIN_CC


def format_cc(cc: tuple[int, int] | None) -> str | None:
    """(7, 5) -> "7.5"."""
    return None if cc is None else f"{cc[0]}.{cc[1]}"


def lookup(name: str) -> KnownGpu | None:
    """The known GPU a (marketing or driver-reported) name refers to, or None."""
    tokens = _tokens(name)
    # Board variants come last and keep the chip ("A100-SXM4-80GB", "H100 80GB HBM3", "RTX 6000 Ada Generation"),
    # so drop trailing words until a known name remains.
    for end in range(len(tokens), 0, -1):
        gpu = _BY_NAME.get("".join(tokens[:end]))
        if gpu is not None:
            return gpu
    return None


@dataclass(frozen=True)
class GpuPlan:
    """What `--gpu` asks to plan for: one GPU kind (or none), without touching this machine."""

    spec: str
    backend: str  # cuda | rocm | mps | none
    name: str | None = None
    compute_capability: tuple[int, int] | None = None
    memory_bytes: int | None = None
    native_bf16: bool | None = None
    note: str = ""
    # Why memory_bytes is what it is: "T4: 16 GiB", "A100 ships with 40 or 80 GB: planned for 40 (say A100-80GB)".
    memory_note: str = ""
    # What the memory plan uses: memory_bytes, or for an ambiguous name the smallest size it ships with.
    assumed_memory_bytes: int | None = None

    @property
    def label(self) -> str:
        """How the plan is named in messages: "T4 (sm_75)", "sm_80", "no GPU"."""
        if self.backend == "none":
            return "no GPU"
        sm = f"sm_{self.compute_capability[0]}{self.compute_capability[1]}" if self.compute_capability else None
        if self.name and sm:
            return f"{self.name} ({sm})"
        return self.name or sm or self.spec


_CC = re.compile(r"^(?:sm_?|compute_?|cc)?(\d{1,2})\.(\d)$|^(?:sm_?|compute_?)(\d{1,2})(\d)[af]?$")
_NONE = {"none", "cpu", "no", "nogpu", "no-gpu", "off"}


# "2xA100", "8 x H100", "4*T4", "A100-80GB x 2": a count written into the GPU's name.
_COUNTED = (re.compile(r"^(\d{1,3})\s*[x×*]\s*(.+)$", re.I), re.compile(r"^(.+?)\s*[x×*]\s*(\d{1,3})$", re.I))


def _refuse_a_count(raw: str) -> None:
    """A known GPU with a count in its name is refused with both options: the nearest name alone (what difflib offers)
    would plan one GPU where the user has several."""
    for i, pattern in enumerate(_COUNTED):
        m = pattern.match(raw)
        if m is None:
            continue
        count, name = (m.group(1), m.group(2)) if i == 0 else (m.group(2), m.group(1))
        try:
            parse_gpu_spec(name)
        except UsageError:
            continue
        spec = f"'{name}'" if " " in name else name
        raise UsageError(f"--gpu {raw!r} names {int(count)} GPUs: the count is its own option, "
                         f"--gpu {spec} --num-gpus {int(count)}")


def parse_gpu_spec(text: str) -> GpuPlan:
    """Parse a --gpu value: a compute capability, a known GPU name, or none. Raises UsageError otherwise."""
    raw = (text or "").strip()
    low = raw.lower()
    if low in _NONE:
        return GpuPlan(spec=raw, backend="none", native_bf16=False)
    m = _CC.match(low.replace(" ", ""))
    if m:
        major = int(m.group(1) or m.group(3))
        minor = int(m.group(2) or m.group(4))
        cc = (major, minor)
        if not (3 <= major <= 15):
            raise UsageError(f"--gpu {raw!r}: compute capability {major}.{minor} is not a CUDA GPU's; use {ACCEPTED_FORMS}")
        return GpuPlan(spec=raw, backend="cuda", compute_capability=cc, native_bf16=cuda_native_bf16(cc))
    _refuse_a_count(raw)  # before the lookup: "A100-80GB x 2" was read as one A100-80GB
    size = _SIZE.search(raw)
    gpu = lookup(_SIZE.sub(" ", raw) if size else raw)
    if gpu is None:
        hint = ""
        import difflib  # only for a --gpu name not known

        close = difflib.get_close_matches(_norm(raw), list(_BY_NAME), n=1, cutoff=0.75) if _norm(raw) else []
        if close:
            hint = f" (did you mean {_BY_NAME[close[0]].name}?)"
        raise UsageError(f"--gpu {raw!r} is not a GPU gemma-doctor knows{hint}; use {ACCEPTED_FORMS}")
    native = cuda_native_bf16(gpu.compute_capability) if gpu.backend == "cuda" else gpu.native_bf16
    gib, why = memory_of(gpu, int(size.group(1)) if size else None, raw)
    name = f"{gpu.name}-{gib}GB" if size and gib else gpu.name
    # A bare name of a GPU sold in several sizes states no size as a fact; the memory plan assumes the smallest.
    ambiguous = size is None and len(gpu.memory_options) > 1
    reported = None
    if gib:
        reported, source = reported_memory(gpu.name, gib)
        why = f"{why}: {source}" if gpu.backend == "cuda" else why
        if gpu.backend != "cuda":  # rocm/mps: no nvidia-smi figure; the marketed size as GiB
            reported = gib * GIB
    return GpuPlan(spec=raw, backend=gpu.backend, name=name, compute_capability=gpu.compute_capability,
                   memory_bytes=None if ambiguous or not gib else reported, native_bf16=native, note=gpu.note,
                   memory_note=why, assumed_memory_bytes=reported)


# A memory size written into a GPU name: "A100-80GB", "A100 80G", "V100-SXM2-32GB", "H100 94 GB".
_SIZE = re.compile(r"(?<![0-9a-z])(\d{1,3})\s*(?:gb|gib|g)(?![a-z0-9])", re.IGNORECASE)


def memory_of(gpu: KnownGpu, written: int | None, spec: str) -> tuple[int | None, str]:
    """(GiB, why) for a known GPU and the size written in its name: the written size must be one the model ships
    with; a bare name of a model with several sizes plans for the smallest, and says so."""
    sizes = gpu.memory_options or ((gpu.memory_gib,) if gpu.memory_gib else ())
    if written is not None:
        if sizes and written not in sizes:
            raise UsageError(f"--gpu {spec!r}: {gpu.name} ships with {' or '.join(f'{s} GB' for s in sizes)}, not {written} GB; "
                             "use --gpu-memory for another size")
        return written, f"{gpu.name}: {written} GB (from the name)"
    if not sizes:
        return None, f"{gpu.name}: memory size unknown (pass --gpu-memory)"
    if len(sizes) == 1:
        return sizes[0], f"{gpu.name}: {sizes[0]} GB marketed"
    alt = "-".join((gpu.name.replace(" ", "-"), f"{sizes[-1]}GB"))
    return sizes[0], (f"{gpu.name} ships with {' or '.join(f'{s}' for s in sizes)} GB: planned for the smallest, "
                      f"{sizes[0]} GB (say --gpu {alt} or --gpu-memory {sizes[-1]} for the larger)")


# Total memory as the device reports it (nvidia-smi's MiB total, what torch.cuda.mem_get_info sees as the total), by
# (GPU, marketed GB): vendors quote decimal GB and part of it is reserved (ECC on GDDR takes 6.25%), so a "16 GB" T4
# reports 15,360 MiB. Sources in docs/decision.md ("GPU memory"); the plan's assumptions name the figure used.
REPORTED_MIB: dict[tuple[str, int], tuple[int, str]] = {
    ("T4", 16): (15_360, "nvidia-smi (modal-labs/modal-client PR #2797)"),
    ("L4", 24): (23_034, "nvidia-smi (modal-labs/modal-client PR #2797)"),
    ("A10", 24): (23_028, "nvidia-smi (modal-labs/modal-client PR #2797)"),
    ("L40S", 48): (46_068, "nvidia-smi (modal-labs/modal-client PR #2797)"),
    ("A100", 40): (40_960, "nvidia-smi (modal-labs/modal-client PR #2797)"),
    ("A100", 80): (81_920, "nvidia-smi (modal-labs/modal-client PR #2797)"),
    ("H100", 80): (81_559, "nvidia-smi, H100 SXM (modal-labs/modal-client PR #2797)"),
    ("H100", 94): (95_830, "nvidia-smi, H100 NVL, driver 535 (NVIDIA/gpu-admin-tools #4)"),
    ("V100", 16): (16_160, "nvidia-smi, V100-SXM2-16GB, driver 440 (4paradigm/k8s-vgpu-scheduler #7)"),
    ("V100", 32): (32_768, "nvidia-smi, V100-SXM2-32GB, driver 525 (Wan-Video/Wan2.1 #5)"),
    ("A10G", 24): (23_028, "nvidia-smi, driver 535 (NVIDIA/DCGM #232)"),
    ("RTX 3060", 12): (12_288, "nvidia-smi, driver 580 (geerlingguy/raspberry-pi-pcie-devices #790)"),
    ("RTX 3090", 24): (24_576, "nvidia-smi, driver 580 (noonghunna/club-3090 #390)"),
    ("RTX 4090", 24): (24_564, "nvidia-smi, driver 550 (RLinf/RLinf #255)"),
    ("RTX A6000", 48): (46_068, "nvidia-smi with ECC on, driver 550 (thamada/gls RTX_A6000_x9_smi.py)"),
    ("A40", 48): (46_068, "nvidia-smi with ECC on, driver 550 (thamada/nvidia-smi A40x10_smi.py)"),
    ("H200", 141): (143_771, "nvidia-smi, driver 550 (NVIDIA/cuda-samples #311)"),
    ("B200", 180): (183_359, "nvidia-smi, driver 580 (NVIDIA/TensorRT-LLM #10278)"),
    ("GH200", 96): (97_871, "nvidia-smi, GH200 480GB, driver 570 (hu-po/warp-ik docs/specs/arm-gh200.md)"),
}
# Where no reported total is recorded: the marketed size as GiB less the 6.25% that ECC reserves on a T4 (the largest
# reservation recorded above), so that an unrecorded GPU is never planned larger than it reports.
UNRECORDED_SHARE = 0.9375


def reported_memory(name: str, gb: int) -> tuple[int, str]:
    """(bytes, where the figure comes from) of a GPU marketed with ``gb`` GB, as the device reports its total."""
    known = REPORTED_MIB.get((name, gb))
    if known is not None:
        mib, source = known
        return mib * 1024**2, f"{mib:,} MiB as {source} reports it"
    size = int(gb * GIB * UNRECORDED_SHARE)
    return size, (f"{size / 1024**2:,.0f} MiB estimated ({UNRECORDED_SHARE:.2%} of {gb} GiB: no reported total recorded "
                  f"for a {gb} GB {name}; pass --gpu-memory with nvidia-smi's figure)")


# Common training GPUs, smallest first, as --gpu names them: where a run that fits nowhere here would fit.
COMMON_TRAINING_GPU_NAMES = ("T4", "L4", "A10G", "RTX 4090", "V100-32GB", "A100-40GB", "L40S", "A100-80GB", "H100",
                             "H200", "B200", "MI300X")


@dataclass(frozen=True)
class CommonGpu:
    """One of the common training GPUs with its reported memory and native bf16."""

    name: str
    memory_bytes: int
    native_bf16: bool


def common_training_gpus() -> tuple[CommonGpu, ...]:
    """COMMON_TRAINING_GPU_NAMES as plans, smallest reported memory first."""
    global _COMMON
    if _COMMON is None:
        plans = [parse_gpu_spec(n) for n in COMMON_TRAINING_GPU_NAMES]
        _COMMON = tuple(sorted((CommonGpu(n, p.assumed_memory_bytes or 0, bool(p.native_bf16))
                                for n, p in zip(COMMON_TRAINING_GPU_NAMES, plans)), key=lambda g: g.memory_bytes))
    return _COMMON


_COMMON: tuple[CommonGpu, ...] | None = None


def usable_bytes(gpu: CommonGpu) -> int:
    """The memory a plan is judged against on ``gpu`` (the reported total; the CUDA context is part of the plan)."""
    return gpu.memory_bytes


def parse_memory(text: str) -> int:
    """A --gpu-memory value ("80", "80GB", "40 GiB", "15.5") -> bytes; UsageError otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(gb|gib|g)?\s*", text or "", re.IGNORECASE)
    if not m or float(m.group(1)) <= 0 or float(m.group(1)) > 4096:
        raise UsageError(f"--gpu-memory {text!r}: give the GPU's memory in GiB, e.g. --gpu-memory 80")
    return int(float(m.group(1)) * GIB)


def emulation_trap(backend: str, native_bf16: bool | None) -> bool:
    """True where torch.cuda.is_bf16_supported() says True although bf16 is not native (facts.md section 3)."""
    if backend == "cuda":
        # Since torch 2.4 the default including_emulation=True succeeds on any CUDA GPU that can hold a bf16 tensor.
        return native_bf16 is False
    if backend == "rocm":
        # ROCm builds return True before looking at the GPU at all.
        return native_bf16 is not True
    return False
