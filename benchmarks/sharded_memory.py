"""Sharded memory plan vs measured: real FSDP2 (torch.distributed.fsdp.fully_shard) on CPU processes with gloo.

Each row trains a Gemma-shaped model (random init, built locally) for a few steps on WORLD processes, each rank in
its own process, and records per rank the peak RSS above the rank's baseline (VmHWM minus VmRSS taken after a warm-up
and before the model is built; the high-water mark is reset once the model is sharded, so building the full model
before sharding does not count, as on a GPU where a rank never holds more than its shard after `fully_shard`).

Sharding follows accelerate's FSDP2 preparation: every decoder layer is its own `fully_shard` unit, the root holds
the tied embedding / lm_head and the final norm. `reshard_after_forward=True` is FULL_SHARD (ZeRO-3: parameters,
gradients and optimizer states sharded), `False` is SHARD_GRAD_OP (ZeRO-2: parameters stay gathered between forward
and backward). The plan is gemma_doctor.memory's for the same model, batch, sequence and optimizer, with num_gpus =
WORLD and zero_stage 3 or 2 (what runplan reads from FULL_SHARD / SHARD_GRAD_OP).

    python benchmarks/sharded_memory.py measure --out benchmarks/results/sharded-memory-cpu.json   # minutes
    python benchmarks/sharded_memory.py report benchmarks/results/sharded-memory-cpu.json

RSS counts what glibc malloc kept after frees, too: on the rows with many mid-sized tensors (layers of 10-30 MB,
batch 2 x 256) its arenas kept up to 1.2 GiB per rank. `--malloc-mmap-threshold 1048576` gives every allocation of
1 MiB and more its own mapping, returned when freed, so the peak RSS follows the live tensors (what a GPU's
max_memory_allocated reports); `--live` counts the live tensors themselves with torch's FSDPMemTracker. `--rows`
picks rows of GRID by index (one at a time on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.memory import MODELS, _base_names, _reset_hwm, _status  # noqa: E402

# (model, world, strategy, batch, seq): the unsharded run on 1 process is the baseline of the same model.
GRID: list[dict[str, Any]] = [
    {"model": "gemma3-262k-h320", "world": 1, "strategy": "none", "batch": 1, "seq": 128},
    {"model": "gemma3-262k-h320", "world": 2, "strategy": "full_shard", "batch": 1, "seq": 128},
    {"model": "gemma3-262k-h320", "world": 2, "strategy": "shard_grad_op", "batch": 1, "seq": 128},
    {"model": "gemma3-1b-2layers", "world": 1, "strategy": "none", "batch": 1, "seq": 128},
    {"model": "gemma3-1b-2layers", "world": 2, "strategy": "full_shard", "batch": 1, "seq": 128},
    {"model": "gemma3-1b-2layers", "world": 2, "strategy": "shard_grad_op", "batch": 1, "seq": 128},
    # Validation rows, measured after plan() took the sharded model (fitted to none of them): another size (the
    # layers a larger share), batch 2 x 256, Gemma 2 (256,000-token vocabulary, eager attention), and 4 ranks.
    {"model": "gemma3-270m", "world": 2, "strategy": "full_shard", "batch": 2, "seq": 256},
    {"model": "gemma3-270m", "world": 2, "strategy": "shard_grad_op", "batch": 2, "seq": 256},
    {"model": "gemma3-262k-h320", "world": 4, "strategy": "full_shard", "batch": 2, "seq": 256},
    {"model": "gemma2-256k-h320", "world": 2, "strategy": "full_shard", "batch": 2, "seq": 256},
    {"model": "gemma3-270m", "world": 1, "strategy": "none", "batch": 2, "seq": 256},
    # Where the embedding's backward is the peak (1 x 128: small logits), at 2 and 4 ranks.
    {"model": "gemma3-270m", "world": 2, "strategy": "full_shard", "batch": 1, "seq": 128},
    {"model": "gemma3-262k-h320", "world": 4, "strategy": "shard_grad_op", "batch": 1, "seq": 128},
]
# Gemma 3 270M's published text config (google/gemma-3-270m): 640 wide, 18 layers, the 262,144-token vocabulary
# (the embedding is 63% of its 268M parameters, against 82-85% in the rows above).
MODELS = {**MODELS, "gemma3-270m": {
    "model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 640, "num_hidden_layers": 18,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 2048,
    "sliding_window": 512, "query_pre_attn_scalar": 256}}
STEPS = 3
_WARMUP = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "sliding_window": 16}


def _model(config: dict[str, Any], seq: int) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(config)
    model_type = cfg.pop("model_type")
    c = AutoConfig.for_model(model_type, **cfg, use_cache=False, max_position_embeddings=max(seq, 1024))
    return AutoModelForCausalLM.from_config(c, dtype=torch.float32), c.vocab_size


def _shard(model: Any, strategy: str) -> Any:
    from torch.distributed.fsdp import fully_shard

    if strategy == "none":
        return model
    reshard = strategy == "full_shard"
    for layer in model.model.layers:
        fully_shard(layer, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    return model


def _train(model: Any, vocab: int, batch: int, seq: int, steps: int, baseline: int | None = None,
           after_step: Any = None) -> dict[str, int]:
    """``steps`` AdamW steps; with ``baseline``, the last step's peak RSS above it per phase (forward, backward,
    optimizer step: the high-water mark is reset before each), so the report can say which moment peaks."""
    import torch

    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, foreach=False)
    gen = torch.Generator().manual_seed(0)
    phases: dict[str, int] = {}
    hwm = _status("VmHWM") if baseline is not None else 0
    for step in range(steps):
        last = baseline is not None and step == steps - 1
        ids = torch.randint(0, vocab, (batch, seq), generator=gen)
        if last:
            hwm = max(hwm, _status("VmHWM"))  # the overall peak so far survives the per-phase resets
            _reset_hwm()
        loss = model(input_ids=ids, labels=ids).loss
        if last:
            phases["forward"] = _status("VmHWM") - baseline
            hwm = max(hwm, _status("VmHWM"))
            _reset_hwm()
        loss.backward()
        if last:
            phases["backward"] = _status("VmHWM") - baseline
            hwm = max(hwm, _status("VmHWM"))
            _reset_hwm()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if last:
            phases["optimizer-step"] = _status("VmHWM") - baseline
            hwm = max(hwm, _status("VmHWM"))
        del loss
        if after_step is not None:
            after_step()
    if baseline is not None:
        phases["peak"] = hwm - baseline
    return phases


def _rank(rank: int, row: dict[str, Any], port: int, out: str) -> None:
    import gc

    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    world = row["world"]
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    config = MODELS[row["model"]]
    # Warm-up: the same path on a tiny model of the same type, so code and gloo buffers land below the baseline.
    tiny, tiny_vocab = _model({**config, **_WARMUP}, 8)
    _train(_shard(tiny, row["strategy"]), tiny_vocab, 1, 8, 1)
    del tiny
    gc.collect()
    baseline = _status("VmRSS")
    model, vocab = _model(config, row["seq"])
    params = {n: list(p.shape) for n, p in model.named_parameters()}
    model = _shard(model, row["strategy"])
    gc.collect()
    if row.get("live"):
        # Live tensors instead of RSS: torch's own memory tracker (a dispatch mode that counts every tensor storage
        # as it is allocated and freed), FSDP2's for the sharded runs: the figure a GPU's max_memory_allocated
        # gives, without what malloc keeps after frees.
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = MemTracker() if row["strategy"] == "none" else FSDPMemTracker(model)
        if row["strategy"] == "none":
            tracker.track_external(model)
        with tracker:
            _train(model, vocab, row["batch"], row["seq"], STEPS, after_step=tracker.reset_mod_stats)
        peak = tracker.get_tracker_snapshot("peak")
        live = {str(k): {kind: int(v) for kind, v in d.items()} for k, d in peak.items()}
        total = sum(d.get("Total", 0) for d in live.values())
        result = {"rank": rank, "rss_baseline": 0, "rss_peak": total, "live_peak": live, "phases": {},
                  "after_shard": 0, "hwm_reset": False, "params": params, "torch": torch.__version__,
                  "transformers": transformers.__version__}
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
        if world > 1:
            torch.distributed.destroy_process_group()
        return
    reset = _reset_hwm()
    after_shard = _status("VmRSS") - baseline
    phases = _train(model, vocab, row["batch"], row["seq"], STEPS, baseline)
    result = {"rank": rank, "rss_baseline": baseline, "rss_peak": baseline + phases["peak"], "phases": phases,
              "after_shard": after_shard,
              "hwm_reset": reset, "params": params, "torch": torch.__version__,
              "transformers": transformers.__version__}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    if world > 1:
        torch.distributed.destroy_process_group()


def run_row(row: dict[str, Any]) -> dict[str, Any]:
    """Spawn the row's ranks (fresh processes) and gather their figures."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    saved = {k: os.environ.get(k) for k in row.get("env", {})}
    os.environ.update(row.get("env", {}))  # read by glibc when each rank's process starts
    try:
        with tempfile.TemporaryDirectory() as out:
            mp.spawn(_rank, args=(row, port, out), nprocs=row["world"], join=True)
            ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(row["world"])]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    params = ranks[0].pop("params")
    for r in ranks[1:]:
        r.pop("params")
    return {"row": row, "ranks": ranks, "params": params}


def plan_for(doc: dict[str, Any]):  # noqa: ANN201 - a gemma_doctor.memory.MemoryPlan
    """gemma-doctor's per-GPU plan for the row: fp32 full fine-tuning, AdamW, the row's sharding, on CPU."""
    from gemma_doctor.plan import memory
    from gemma_doctor.run import Settings

    row = doc["row"]
    shape = memory.shape_from_config(MODELS[row["model"]], memory.counts_from_names(_base_names(doc["params"])))
    stage = {"none": 0, "full_shard": 3, "shard_grad_op": 2}[row["strategy"]]
    run = Settings(method="full", precision="fp32", load_dtype="float32", optimizer="adamw_torch",
                         batch_size=row["batch"], seq_len=row["seq"], num_gpus=row["world"], zero_stage=stage,
                         fsdp=stage > 0,
                         device="cpu", attention="sdpa")
    return memory.plan(shape, run)


def proposed(doc: dict[str, Any]) -> int:
    """What the measurements say the per-rank peak is (fp32 full fine-tuning with AdamW, at the embedding's backward):
    the plan's sharded parts, plus the unit holding the tied embedding / lm_head (the root, in accelerate's FSDP2
    wrapping) gathered whole, its gradient produced whole (from the lm_head, from the input embedding, their sum), and
    FSDP2's reduce-scatter input, a flat copy of that unsharded gradient. The earlier proposal, fitted to the first
    four sharded rows' RSS; plan() took FSDP2's mechanism instead, and this is kept to compare (docs/benchmarks.md)."""
    import math

    names = _base_names(doc["params"])
    total = 4 * sum(math.prod(v) if isinstance(v, list) else v for v in names.values())
    embed = 4 * math.prod(names["model.embed_tokens.weight"])
    n = doc["row"]["world"]
    sharded = total // n + 2 * total // n + (total - embed) // n  # weights, AdamW's two states, the other gradients
    gathered = embed - embed // n
    reduce_scatter = embed if n > 1 else 0
    return sharded + gathered + 3 * embed + reduce_scatter


def measure(args: argparse.Namespace) -> None:
    docs = []
    for i, row in enumerate(GRID):
        if args.rows and i not in args.rows:
            continue
        if args.live:
            row = {**row, "live": True}
        if args.malloc_mmap_threshold:
            # glibc's fixed mmap threshold: every allocation from this size up is its own mapping, returned to the
            # system when freed, so RSS follows the live tensors (as max_memory_allocated does on a GPU) instead of
            # keeping what malloc's arenas hold after frees (docs/benchmarks.md).
            row = {**row, "env": {"MALLOC_MMAP_THRESHOLD_": str(args.malloc_mmap_threshold)}}
        print(f"running {row}", file=sys.stderr, flush=True)
        docs.append(run_row(row))
        Path(args.out).write_text(json.dumps(docs, indent=1) + "\n")


def report(args: argparse.Namespace) -> None:
    docs = [d for results in args.results for d in json.loads(Path(results).read_text())]
    print("| model | ranks | sharding | b x s | measured per rank (max) | plan per GPU | plan / measured | "
          "fitted proposal / measured | unsharded / measured | plan's peak moment |")
    print("| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    key = lambda row: (row["model"], row["batch"], row["seq"], bool(row.get("env")), bool(row.get("live")))  # noqa: E731
    single = {key(d["row"]): max(r["rss_peak"] - r["rss_baseline"] for r in d["ranks"])
              for d in docs if d["row"]["world"] == 1}
    for doc in docs:
        row = doc["row"]
        measured = max(r["rss_peak"] - r["rss_baseline"] for r in doc["ranks"])
        p = plan_for(doc)
        alone = single.get(key(row))
        mmap = row.get("env", {}).get("MALLOC_MMAP_THRESHOLD_")
        strategy = row["strategy"] + (f" (mmap >= {int(mmap) // 1024} KiB)" if mmap else "") + (
            " (live tensors)" if row.get("live") else "")
        print(f"| {row['model']} | {row['world']} | {strategy} | {row['batch']} x {row['seq']} | "
              f"{measured / 2**30:.3f} GiB | {p.per_gpu_bytes / 2**30:.3f} GiB | {p.per_gpu_bytes / measured:.2f} | "
              f"{proposed(doc) / measured:.2f} | "
              + (f"{alone / measured:.2f}" if alone else "–") + f" | {p.peak} |")
        worst = max(doc["ranks"], key=lambda r: r["rss_peak"] - r["rss_baseline"])
        moments = ", ".join(f"{k} {v / 2**30:.3f}" for k, v in worst.get("phases", {}).items() if k != "peak")
        print(f"|   measured by moment (GiB) | | | | {moments} | plan's parts (GiB): "
              f"{', '.join(f'{k} {v / 2**30:.3f}' for k, v in p.components.items())} | | | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", required=True)
    m.add_argument("--rows", type=lambda v: [int(x) for x in v.split(",")], default=None,
                   help="indexes into GRID, comma-separated (default: every row)")
    m.add_argument("--live", action="store_true",
                   help="measure the live tensors' peak with torch's memory tracker (FSDPMemTracker) instead of RSS")
    m.add_argument("--malloc-mmap-threshold", type=int, default=None, metavar="BYTES",
                   help="set glibc's MALLOC_MMAP_THRESHOLD_ in the ranks (e.g. 1048576)")
    r = sub.add_parser("report")
    r.add_argument("results", nargs="+")
    args = parser.parse_args()
    {"measure": measure, "report": report}[args.cmd](args)


if __name__ == "__main__":
    main()
