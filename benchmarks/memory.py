"""Memory plan vs measured peak: train real (random-init, locally built) Gemma-shaped models for a few steps.

Each row runs in a fresh subprocess and records what training actually held at its peak:

- on a CPU: peak RSS above the process's baseline (VmHWM minus VmRSS after imports, before the model is built);
- on a CUDA GPU: torch.cuda.max_memory_allocated() and max_memory_reserved() (bytes of tensors, and what the
  caching allocator took from the driver), plus the same RSS figures.

The plan (gemma_doctor.plan.memory) is computed afterwards from the same inputs, so the model can be tuned and the
table re-rendered without training again:

    python benchmarks/memory.py measure --out benchmarks/results/memory-cpu.json     # trains (minutes)
    python benchmarks/memory.py report benchmarks/results/memory-cpu.json            # plan vs measured table
    python benchmarks/memory.py measure --grid gpu --out memory-cuda.json            # on a GPU: Gemma 3 1B / 4B sizes

Rows mimic transformers' Trainer: the loss is computed under autocast (when mixed precision is on), backward runs
outside it, AdamW is torch's fused AdamW (Trainer's default optim "adamw_torch_fused"), gradients are dropped with
zero_grad(set_to_none=True), gradient checkpointing is transformers' (non-reentrant), attention is what
transformers picks (sdpa for Gemma 3, eager for Gemma 2). The peak is taken over all steps (step 1 creates the
optimizer states; later steps hold them).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Text-model configs with real Gemma shapes where memory depends on them: the 262,144-token vocabulary (Gemma 3)
# and 256,000 (Gemma 2), head_dim 256, GQA, sliding-window layer pattern, Gemma 2's logit soft-capping.
MODELS: dict[str, dict[str, Any]] = {
    # Gemma 3 with the real vocabulary and a narrow body: the logits (b*s*262144) dominate, as in every small Gemma.
    "gemma3-262k-h320": {"model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 320, "num_hidden_layers": 6,
                          "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                          "intermediate_size": 1920, "sliding_window": 512, "query_pre_attn_scalar": 256},
    # Gemma 3 1B's layer shapes (hidden 1152, intermediate 6912, 4 heads, 1 KV head, head_dim 256) with 2 of its 26
    # layers, and the real vocabulary: 302M embedding parameters.
    "gemma3-1b-2layers": {"model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 1152, "num_hidden_layers": 2,
                           "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                           "intermediate_size": 6912, "sliding_window": 512, "query_pre_attn_scalar": 256},
    # Gemma 2 (2B's head layout, narrow body): soft-capped logits and attention, eager attention, 256k vocabulary.
    "gemma2-256k-h320": {"model_type": "gemma2", "vocab_size": 256000, "hidden_size": 320, "num_hidden_layers": 4,
                          "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 1920,
                          "sliding_window": 4096, "query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0,
                          "final_logit_softcapping": 30.0},
    # GPU grid: the real Gemma 3 1B text model and Gemma 3 4B's text model.
    "gemma3-1b": {"model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 1152, "num_hidden_layers": 26,
                  "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 6912,
                  "sliding_window": 512, "query_pre_attn_scalar": 256},
    "gemma3-4b-text": {"model_type": "gemma3_text", "vocab_size": 262208, "hidden_size": 2560, "num_hidden_layers": 34,
                       "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 10240,
                       "sliding_window": 1024, "query_pre_attn_scalar": 256},
}


@dataclass(frozen=True)
class Row:
    """One training run of the grid."""

    model: str
    method: str  # full | lora | qlora
    precision: str  # fp32 | amp (fp32 weights, bf16 autocast) | bf16 (bf16 weights, bf16 autocast)
    checkpointing: bool
    batch: int
    seq: int
    steps: int = 3
    lora_r: int = 16


@dataclass
class Result:
    """What one row measured."""

    row: Row
    device: str
    ok: bool
    error: str | None = None
    rss_baseline: int = 0
    rss_peak: int = 0  # VmHWM
    cuda_allocated: int | None = None
    cuda_reserved: int | None = None
    trainable: int = 0
    params: dict[str, int] = field(default_factory=dict)
    attn: str | None = None
    seconds: float = 0.0
    versions: dict[str, str] = field(default_factory=dict)
    hwm_reset_after_build: bool = False
    # A tiny model of the same kind was trained before the baseline, so code loaded on first use is not counted.
    warmed_up: bool = False

    @property
    def measured(self) -> int:
        """The peak the plan is compared with: CUDA max allocated on a GPU, RSS above baseline on a CPU."""
        if self.cuda_allocated is not None:
            return self.cuda_allocated
        return self.rss_peak - self.rss_baseline


def grid(name: str) -> list[Row]:
    """The rows of a named grid."""
    rows: list[Row] = []
    if name in ("cpu", "cpu-bf16", "quick"):
        # Two batch x sequence sizes, full / LoRA, checkpointing off / on, on the 262k-vocabulary Gemma 3, in fp32;
        # Gemma 2's soft-capping and QLoRA (fp32 compute, as on a T4) one row each. "cpu-bf16" adds the bf16 rows
        # (bf16 weights under bf16 autocast, and AMP): they need a CPU with native bf16 GEMMs (AVX-512 BF16 / AMX);
        # without, torch's fallback made one 2-step row take over 20 minutes on this machine.
        sizes = [(1, 128), (2, 256)] if name != "quick" else [(1, 64)]
        precisions = ("fp32", "bf16") if name == "cpu-bf16" else ("fp32",)
        m = "gemma3-262k-h320"
        for b, s in sizes:
            for ckpt in (False, True):
                for method in ("full", "lora"):
                    for prec in precisions:
                        rows.append(Row(m, method, prec, ckpt, b, s, steps=2))
        if name == "quick":
            return rows
        if name == "cpu-bf16":
            rows.append(Row(m, "full", "amp", False, 2, 256, steps=2))
        rows.append(Row("gemma2-256k-h320", "full", "fp32", False, 1, 128, steps=2))
        rows.append(Row(m, "qlora", "fp32", False, 1, 128, steps=2))
        return rows
    if name == "gpu":
        for m in ("gemma3-1b", "gemma3-4b-text"):
            for b, s in [(1, 512), (4, 1024)]:
                for ckpt in (False, True):
                    if m == "gemma3-1b":
                        rows.append(Row(m, "full", "fp32", ckpt, b, s))
                        rows.append(Row(m, "full", "amp", ckpt, b, s))
                    rows.append(Row(m, "full", "bf16", ckpt, b, s))
                    rows.append(Row(m, "lora", "bf16", ckpt, b, s))
                    rows.append(Row(m, "qlora", "bf16", ckpt, b, s))
        return rows
    raise SystemExit(f"unknown grid {name!r}: cpu, cpu-bf16, quick or gpu")


# --- the child: one training run ---------------------------------------------------------------

def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _save_bf16(cfg: Any) -> str:
    """A random model saved in bf16 to a temp folder: QLoRA's from_pretrained is what quantizes."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM

    tmp = tempfile.mkdtemp(prefix="gd-qlora-")
    AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(tmp)
    return tmp


def _build(row: Row, cfg: Any, device: str, versions: dict[str, str], saved: str | None = None) -> Any:
    """The row's model: random init in the row's dtype, wrapped by PEFT (and quantized from ``saved``, a folder
    _save_bf16 wrote, for QLoRA) as the method says."""
    import torch
    from transformers import AutoModelForCausalLM

    load_dtype = torch.bfloat16 if row.precision == "bf16" else torch.float32
    if row.method == "qlora":
        import bitsandbytes
        import peft
        from transformers import BitsAndBytesConfig

        versions["peft"], versions["bitsandbytes"] = peft.__version__, bitsandbytes.__version__
        compute = torch.float32 if row.precision == "fp32" else torch.bfloat16
        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                 bnb_4bit_compute_dtype=compute)
        model = AutoModelForCausalLM.from_pretrained(saved or _save_bf16(cfg), quantization_config=bnb, dtype=compute,
                                                     device_map={"": device})
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=row.checkpointing)
        return peft.get_peft_model(model, peft.LoraConfig(r=row.lora_r, lora_alpha=2 * row.lora_r,
                                                          target_modules="all-linear", task_type="CAUSAL_LM"))
    model = AutoModelForCausalLM.from_config(cfg, dtype=load_dtype)
    model.to(device)
    if row.method == "lora":
        import peft

        versions["peft"] = peft.__version__
        model = peft.get_peft_model(model, peft.LoraConfig(r=row.lora_r, lora_alpha=2 * row.lora_r,
                                                           target_modules="all-linear", task_type="CAUSAL_LM"))
    return model


def _train(model: Any, row: Row, vocab_size: int, device: str) -> None:
    """``row.steps`` optimizer steps, as transformers' Trainer takes them."""
    import torch

    if row.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if row.method != "full":
            model.enable_input_require_grads()
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, fused=True)
    gen = torch.Generator().manual_seed(0)
    for _ in range(row.steps):
        ids = torch.randint(0, vocab_size, (row.batch, row.seq), generator=gen).to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=row.precision in ("amp", "bf16")):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss


# A model of the row's type, method and precision, small enough that its tensors are negligible: training it once
# before the baseline loads everything that is code, not tensors (transformers' lazily imported modeling module,
# PEFT and its tuners, bitsandbytes, the autograd engine's threads, the fused optimizer's kernels): ~0.1 GiB of RSS
# measured here, which the plan does not count and which would otherwise land above the baseline.
_WARMUP = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "sliding_window": 16}


def run_row(row: Row, device: str, warmup: bool = True) -> Result:
    """Train one row in this process (called in a fresh subprocess)."""
    import gc

    import torch
    import transformers
    from transformers import AutoConfig

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    cfg_dict = dict(MODELS[row.model])
    model_type = cfg_dict.pop("model_type")
    cfg = AutoConfig.for_model(model_type, **cfg_dict, use_cache=False, max_position_embeddings=max(row.seq, 1024))
    cuda = device == "cuda"
    if cuda:
        torch.cuda.init()
        torch.zeros(1, device="cuda")  # the CUDA context exists before the baseline
    if warmup:
        tiny = AutoConfig.for_model(model_type, **{**cfg_dict, **_WARMUP}, use_cache=False, max_position_embeddings=1024)
        small = Row(row.model, row.method, row.precision, row.checkpointing, 1, 8, steps=1, lora_r=row.lora_r)
        _train(_build(small, tiny, device, {}), small, tiny.vocab_size, device)
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    # QLoRA's random bf16 model is built and saved before the baseline: only the quantized load counts.
    saved = _save_bf16(cfg) if row.method == "qlora" else None
    gc.collect()
    baseline = _status("VmRSS")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    model = _build(row, cfg, device, versions, saved)
    params = {n: list(p.shape) for n, p in model.named_parameters()}
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    attn = getattr(model.config, "_attn_implementation", None)
    # Building the model (random init, PEFT wrapping, quantization) can itself peak above training (the init holds
    # temporaries); reset the high-water mark so that VmHWM is training's peak, still measured from the baseline
    # taken before the model existed (Linux >= 4.0: writing 5 to clear_refs resets VmHWM to the current RSS).
    reset = _reset_hwm()
    _train(model, row, cfg.vocab_size, device)
    out = Result(row, device, True, rss_baseline=baseline, rss_peak=_status("VmHWM"), trainable=trainable,
                 params=params, attn=attn, seconds=time.perf_counter() - t0, versions=versions,
                 hwm_reset_after_build=reset, warmed_up=warmup)
    if cuda:
        out.cuda_allocated = int(torch.cuda.max_memory_allocated())
        out.cuda_reserved = int(torch.cuda.max_memory_reserved())
    return out


def _child(args: argparse.Namespace) -> None:
    row = Row(**json.loads(args.row))
    try:
        res = run_row(row, args.device, warmup=not args.no_warmup)
    except Exception as e:  # noqa: BLE001 - a row that cannot run is reported, not a crash of the grid
        res = Result(row, args.device, False, error=f"{type(e).__name__}: {e}".splitlines()[0][:500])
    doc = asdict(res)
    doc["params"] = res.params
    sys.stdout.write("RESULT " + json.dumps(doc) + "\n")


def measure(args: argparse.Namespace) -> None:
    """Run every row of the grid, each in a fresh subprocess; append results to --out as they come."""
    device = args.device
    if device == "auto":
        try:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            device = "cpu"
    out = Path(args.out)
    done: list[dict[str, Any]] = json.loads(out.read_text()) if out.exists() and args.resume else []
    seen = {json.dumps(d["row"], sort_keys=True) for d in done}
    rows = grid(args.grid)
    if args.only:
        rows = [r for r in rows if all(part in json.dumps(asdict(r)) for part in args.only)]
    for row in rows:
        key = json.dumps(asdict(row), sort_keys=True)
        if key in seen:
            continue
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
        if args.fixed_mmap:
            # glibc raises its mmap threshold (up to 32 MiB) each time a large block is freed, so later tensors below
            # it land in the heap and stay in RSS after they are freed. A fixed threshold returns every tensor of
            # 64 KiB or more to the system when freed: RSS then tracks live tensors, like CUDA's max_memory_allocated.
            env["MALLOC_MMAP_THRESHOLD_"] = "65536"
        cmd = [sys.executable, __file__, "child", "--device", device, "--row", json.dumps(asdict(row))]
        p = subprocess.run(cmd + (["--no-warmup"] if args.no_warmup else []), capture_output=True, text=True, env=env)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            doc = {"row": asdict(row), "device": device, "ok": False,
                   "error": f"exit {p.returncode}: " + (p.stderr.strip().splitlines() or ["(no output)"])[-1][:500]}
        else:
            doc = json.loads(line[len("RESULT "):])
        doc["malloc"] = "fixed mmap threshold 64 KiB" if args.fixed_mmap else "glibc defaults"
        done.append(doc)
        out.write_text(json.dumps(done, indent=1) + "\n")
        peak = (doc.get("cuda_allocated") or (doc.get("rss_peak", 0) - doc.get("rss_baseline", 0))) / 2**30
        print(f"{row.model:18} {row.method:5} {row.precision:4} ckpt={int(row.checkpointing)} b{row.batch} s{row.seq}: "
              + (f"{peak:.3f} GiB in {doc.get('seconds', 0):.0f} s" if doc.get("ok") else f"FAILED {doc.get('error')}"),
              flush=True)


# --- the plan side ------------------------------------------------------------------------------

def plan_for(doc: dict[str, Any]):  # noqa: ANN201 - a gemma_doctor.plan.memory.MemoryPlan
    """gemma-doctor's plan for a measured row (same model, method, precision, batch, sequence, optimizer)."""
    from gemma_doctor.plan import memory
    from gemma_doctor.run import Settings

    row = doc["row"]
    config = dict(MODELS[row["model"]])
    names = _base_names(doc["params"])
    # Rows recorded before shapes were kept hold numels only: their counts are derived from the config, which
    # tests/test_memory.py checks equal to the real model's.
    exact = all(isinstance(v, list) for v in names.values())
    shape = memory.shape_from_config(config, memory.counts_from_names(names) if exact else None)
    precision, load = {"fp32": ("fp32", "float32"), "amp": ("bf16", "float32"), "bf16": ("bf16", "bfloat16")}[row["precision"]]
    run = Settings(method=row["method"], precision=precision, load_dtype=load, optimizer="adamw_torch_fused",
                         batch_size=row["batch"], seq_len=row["seq"], gradient_checkpointing=row["checkpointing"],
                         lora_r=row["lora_r"], lora_targets="all-linear", device=doc["device"],
                         attention=doc.get("attn") or "sdpa", quant_bits=4 if row["method"] == "qlora" else None)
    return memory.plan(shape, run)


def _base_names(params: dict[str, int]) -> dict[str, int]:
    """Parameter names as the checkpoint holds them: PEFT's wrappers and adapters removed."""
    out: dict[str, int] = {}
    for name, n in params.items():
        if isinstance(n, list) and len(n) == 1:
            n = n[0]
        if "lora_" in name:
            continue
        name = name.replace("base_model.model.", "").replace(".base_layer", "")
        out[name] = n
    return out


def peers(doc: dict[str, Any]) -> tuple[float, float | None]:
    """(accelerate estimate-memory, LLaMA-Factory's table) in bytes for the row's model and method.

    accelerate (commands/estimate.py, reproduced: it needs the Hub for the config): "Training using Adam" is the
    largest of its parts, batch size 1, no activations, no LoRA: 4 x the fp32 size in fp32, 2 x under mixed
    precision. LLaMA-Factory's README (GB for x billion parameters): full AMP 18x, full bf16 8x, LoRA 2x,
    QLoRA 8-bit x, 4-bit x/2; no fp32 row (None).
    """
    row = doc["row"]
    n = sum(v if isinstance(v, int) else math.prod(v) for v in _base_names(doc["params"]).values())
    acc = 16.0 * n if row["precision"] == "fp32" else 8.0 * n
    x = n / 1e9
    lf = {("full", "amp"): 18 * x, ("full", "bf16"): 8 * x, ("lora", "bf16"): 2 * x, ("lora", "amp"): 2 * x,
          ("qlora", "bf16"): x / 2, ("qlora", "fp32"): x / 2}.get((row["method"], row["precision"]))
    return acc, (lf * 1e9 if lf is not None else None)


def report(args: argparse.Namespace) -> None:
    """Plan vs measured, as a Markdown table, with accelerate's and LLaMA-Factory's figures for the same runs."""
    docs = json.loads(Path(args.results).read_text())
    print("| model | method | precision | ckpt | b x s | measured | plan | plan / measured | accelerate | LLaMA-Factory | peak moment |")
    print("| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    worst = 0.0
    for doc in docs:
        row = doc["row"]
        head = (f"| {row['model']} | {row['method']} | {row['precision']} | {'on' if row['checkpointing'] else 'off'} | "
                f"{row['batch']} x {row['seq']} |")
        if not doc.get("ok"):
            print(f"{head} failed: {doc.get('error')} | | | | | |")
            continue
        measured = doc["cuda_allocated"] if doc.get("cuda_allocated") is not None else doc["rss_peak"] - doc["rss_baseline"]
        p = plan_for(doc)
        if p.trainable_params != doc["trainable"]:
            raise SystemExit(f"plan's trainable parameters {p.trainable_params} != PEFT's {doc['trainable']} for {row}")
        predicted = p.tensor_bytes if doc["device"] == "cuda" else p.total_bytes
        ratio = predicted / measured
        worst = max(worst, abs(ratio - 1))
        acc, lf = peers(doc)
        print(f"{head} {measured / 2**30:.2f} GiB | {predicted / 2**30:.2f} GiB | {ratio:.2f} | {acc / 2**30:.2f} GiB | "
              + (f"{lf / 2**30:.2f} GiB" if lf is not None else "–") + f" | {p.peak} |")
    print(f"\nworst |plan/measured - 1| = {worst:.1%}")


def main() -> None:
    """Command line: measure | report | child."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--grid", default="cpu")
    m.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    m.add_argument("--out", required=True)
    m.add_argument("--resume", action="store_true", help="keep rows already in --out")
    m.add_argument("--only", nargs="*", help="run only rows whose JSON contains every one of these strings")
    m.add_argument("--fixed-mmap", action="store_true", help="MALLOC_MMAP_THRESHOLD_=65536 in the rows (see measure())")
    m.add_argument("--no-warmup", action="store_true",
                   help="take the baseline before any model is built (code loaded on first use then counts as peak)")
    r = sub.add_parser("report")
    r.add_argument("results")
    c = sub.add_parser("child")
    c.add_argument("--device", required=True)
    c.add_argument("--row", required=True)
    c.add_argument("--no-warmup", action="store_true")
    args = ap.parse_args()
    {"measure": measure, "report": report, "child": _child}[args.cmd](args)


if __name__ == "__main__":
    main()
