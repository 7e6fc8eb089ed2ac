"""Findings about saved dtypes, shards and quantization, from the dtype census (ModelFacts.census)."""

from __future__ import annotations

from typing import Iterator

from gemma_doctor.codes import emits
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.report import MODEL_REPO, MODEL_WHERE, Finding, Severity

_ST_TO_TORCH = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}


def _fmt(n: int) -> str:
    for unit, div in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def embedding_note(model: ModelFacts) -> str:
    """For EmbeddingGemma (bidirectional gemma3_text): what fp16 does to it, in the words of its users."""
    if model.family.trait("bidirectional") is not True:
        return ""
    return (" (EmbeddingGemma: activations reach ~800k, unsloth PR #4014; text-embeddings-inference refuses "
            "--dtype float16 with \"Gemma3 is only supported in fp32 precision\", TEI #748)")


def _download(model: ModelFacts, file: str) -> str:
    """The command that replaces ``file`` of this model: hf download for a cached repo, else the author's copy."""
    snap = model.snapshot
    # The same text for a snapshot read from the Hub as for its cached copy: the findings of both agree by design.
    if snap.repo_id is None or (snap.repo_dir is None and not snap.remote):
        return f"copy {file} again from where this folder came from"
    import shlex  # only for a finding that names a file to download

    # The model named by the engine (report.MODEL_REPO, MODEL_WHERE), as locate.redownload_command writes the command.
    names = f" {shlex.quote(file)}" if file else ""
    return f"hf download {MODEL_REPO}{names}{MODEL_WHERE} --force-download"


@emits("GD201", "GD202", "GD203", "GD204", "GD205", "GD206", model_only=True)
def check(model: ModelFacts, env: Environment, options: CheckOptions) -> Iterator[Finding]:
    """GD201-GD206: dtype mismatch, fp16 Gemma 2/3, missing/corrupt shards, bad index, quantized."""
    c = model.census
    if c is None:
        return
    if c.index_error:
        yield Finding("GD206", Severity.ERROR, f"{c.source}: {c.index_error}", file=c.source, key="weight_map",
                      fix=f"download the index again: {_download(model, c.source)}")
    for p in c.index_problems:
        yield Finding("GD206", Severity.ERROR, f"index and shards disagree: {p}", file=c.source, key="weight_map",
                      fix="the index and shards come from different revisions; download the model again")
    for s in c.shards:
        if s.error is None:
            continue
        if not s.exists:
            yield Finding("GD203", Severity.ERROR, f"shard {s.file} is {s.error}", file=s.file,
                          fix=f"download the missing shard: {_download(model, s.file)}")
        else:
            yield Finding("GD204", Severity.ERROR, f"shard {s.file} is not a valid safetensors file: {s.error}", file=s.file,
                          fix=f"download it again: {_download(model, s.file)}; check the disk is not full")
    q = c.quantization
    if q:
        bits = f" {q['bits']}-bit" if q.get("bits") else ""
        comp = q.get("compute_dtype") or "unknown"
        yield Finding("GD205", Severity.INFO, f"quantized checkpoint ({q.get('method') or 'unknown method'}{bits}, "
                      f"from {q.get('source')}); compute dtype {comp}", file="config.json", key="quantization_config",
                      fix=None)
    unsafe = model.family.fp16_unsafe
    weights_torch = _ST_TO_TORCH.get(c.dominant or "")
    if c.declared and c.declared != "auto" and weights_torch and not q and c.declared != weights_torch:
        yield Finding("GD201", Severity.WARNING,
                      f"{c.declared_key} declares {c.declared} but the weights are saved as {c.dominant} "
                      f"({_fmt(c.weights[c.dominant])} parameters); dtype=\"auto\" loads {c.declared}",
                      file="config.json", key=c.declared_key,
                      fix=f"load with an explicit dtype (from_pretrained(..., dtype=torch.{weights_torch})) or set "
                          f"\"{c.declared_key.split('.')[-1]}\": \"{weights_torch}\" to match the weights")
    if unsafe:
        if c.dominant == "F16":
            yield Finding("GD202", Severity.WARNING,
                          f"{model.family.label} weights are saved in float16 ({_fmt(c.weights['F16'])} parameters); its "
                          "activations exceed fp16's 65504 and overflow to inf/NaN" + embedding_note(model),
                          file=c.source, fix="use the original bf16 checkpoint, or load in bfloat16 (fp32 on GPUs without "
                                             "native bf16) and train with bf16=True, never fp16=True")
        elif c.declared == "float16" and not q:
            yield Finding("GD202", Severity.WARNING,
                          f"{c.declared_key} declares float16 for {model.family.label}, whose activations overflow fp16"
                          + embedding_note(model),
                          file="config.json", key=c.declared_key,
                          fix="load with dtype=torch.bfloat16 (fp32 on GPUs without native bf16); set the key to \"bfloat16\"")
        if q and q.get("compute_dtype") == "float16":
            yield Finding("GD202", Severity.WARNING,
                          f"quantized {model.family.label} computes in float16, whose range its activations exceed",
                          file="config.json", key="quantization_config",
                          fix="after loading, set compute_dtype = torch.bfloat16 (where bf16 is native, compute "
                              "capability >= 8.0; else torch.float32) on every bitsandbytes.nn.Linear4bit of the model: "
                              "a BitsAndBytesConfig or axolotl's bnb_config_kwargs does not change a checkpoint saved "
                              "quantized")
