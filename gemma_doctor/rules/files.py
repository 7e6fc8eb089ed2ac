"""Findings about the model folder's files themselves: unreadable, malformed, not Gemma, escaping links."""

from __future__ import annotations

from typing import Iterator

from gemma_doctor.codes import emits
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.readers.jsonfile import JsonFile
from gemma_doctor.report import MODEL_ARGS, Finding, Severity


def _file_problem(code_read: str, code_shape: str, jf: JsonFile, name: str) -> Finding:
    if jf.escapes:
        return Finding("GD005", Severity.ERROR, f"{name} is a link that points outside the repo folder; not read, never written",
                       file=name, fix="delete the snapshot folder and download the model again (hf download)")
    code = code_shape if jf.shape_error else code_read
    return Finding(code, Severity.ERROR, f"{name}: {jf.error}", file=name,
                   fix=f"repair {name} by hand or download it again; gemma-doctor will not rewrite a file it cannot parse")


@emits("GD001", "GD002", "GD003", "GD004", "GD005", "GD006", "GD007", "GD080", "GD020", "GD021", "GD022", model_only=True)
def check(model: ModelFacts, env: Environment, options: CheckOptions) -> Iterator[Finding]:
    """File-level findings; every other rule assumes config.json parsed."""
    problem = model.snapshot.problem
    if problem is not None:
        yield Finding(problem.code, Severity.ERROR, problem.message, file=None,
                      fix="inspect the repo folder (who wrote it?), then delete it and download the model again with "
                          "hf download; gemma-doctor reads and writes nothing of it until then")
        return
    cfg = model.config
    if not cfg.exists and model.adapter is not None:
        pass  # a PEFT adapter has no config.json of its own: rules/after.py reads adapter_config.json and its base
    elif not cfg.exists:
        yield Finding("GD001", Severity.ERROR, "config.json is missing: this folder is not a transformers model",
                      file="config.json", fix="point gemma-doctor at a model folder, or download the model's config.json")
    elif cfg.too_large:
        yield Finding("GD080", Severity.ERROR, f"config.json: {cfg.error}", file="config.json",
                      fix="download config.json again (hf download); a real config is a few KiB")
    elif not cfg.ok:
        yield _file_problem("GD001", "GD002", cfg, "config.json")
    elif model.family.unknown_gemma:
        mt = model.family.model_type
        yield Finding("GD007", Severity.WARNING,
                      f"model_type {mt!r} names a Gemma that gemma-doctor does not know: nothing is checked or fixed, and "
                      "no precision is advised (a newer Gemma may need settings the known ones do not)",
                      file="config.json", key="model_type",
                      fix="upgrade gemma-doctor (pip install -U gemma-doctor); until then follow the model card's "
                          "precision (bf16 where the GPU has it, never fp16 for Gemma 2 and later)")
    elif not model.family.is_gemma:
        mt = model.family.model_type or "unknown"
        yield Finding("GD003", Severity.INFO, f"not a Gemma-family model (model_type {mt!r}); left alone",
                      file="config.json", key="model_type")
    gen = model.generation_config
    if gen.exists and not gen.ok:
        yield _file_problem("GD004", "GD004", gen, "generation_config.json")
    if model.undo.error:
        yield Finding("GD006", Severity.WARNING, f"gemma-doctor's undo record is unreadable: {model.undo.error}",
                      file=".gemma-doctor/undo.json", fix="restore cannot undo earlier fixes; keep the file for inspection")
    elif model.undo.entries:
        names = ", ".join(sorted(model.undo.entries))
        yield Finding("GD006", Severity.INFO, f"rewritten by gemma-doctor fix: {names}", file=None,
                      fix=f"gemma-doctor restore {MODEL_ARGS} brings back the original files")
