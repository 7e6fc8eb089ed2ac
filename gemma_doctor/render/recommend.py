"""The views of `gemma-doctor recommend`: text (reasons + Python), python, yaml (axolotl + accelerate), json."""

from __future__ import annotations

import enum
from typing import Any, Optional, Sequence

SECTION_TITLES = {
    "transformers": "transformers Trainer: TrainingArguments",
    "trl": "TRL trainer config",
    "loading": "loading (transformers / bitsandbytes), use_cache off in memory",
    "loading_text_only": "loading the language model alone (text-only training of a multimodal checkpoint)",
    "peft": "PEFT LoRA adapters",
    "launch": "launch on several GPUs (accelerate)",
    "unsloth": "Unsloth",
    "llama-factory": "LLaMA-Factory (its Python API: the same run as llamafactory-cli train)",
}


# The prescribed trainer's config, as the text view names it (plan/recommend.TRAINER_FORMATS).
TRAINER_WORDS = {"axolotl": "axolotl's YAML", "trl": "a `trl sft --config` YAML (TRL's SFTTrainer)",
                 "transformers": "a TrainingArguments YAML (a plain transformers Trainer)",
                 "llama-factory": "LLaMA-Factory's YAML (`llamafactory-cli train`)"}


def trainer_words(rec: Any) -> str:
    """The prescribed trainer's config in the text view's words (TRAINER_WORDS; TRL's by its command: sft or dpo)."""
    from gemma_doctor.plan.recommend import trl_command

    if rec.trainer == "trl" and trl_command(rec) == "dpo":
        return "a `trl dpo --config` YAML (TRL's DPOTrainer)"
    return TRAINER_WORDS.get(rec.trainer, rec.trainer)


class RecommendFormat(str, enum.Enum):
    """--format choices of `recommend`."""

    TEXT = "text"
    PYTHON = "python"
    YAML = "yaml"
    JSON = "json"


def _name(item: Any) -> str:
    from gemma_doctor.render.style import printable

    if item.planned:
        return f"{item.family} (planned, not downloaded; assumed {item.model_id})"
    rev = f" @ {item.revision}" if item.repo_id and item.revision else ""
    # Shown in comments of pasted Python/YAML too: a newline in a folder name must not end the comment.
    return printable(f"{item.repo_id or item.path}{rev}")


def _pins(item: Any) -> list[str]:
    """What the prescribed run needs before it starts, one line each without markup: the version ranges it was judged
    with, then what `gemma-doctor fix` must cure in the model files first (the text view's "first:" lines)."""
    d = item.decision
    if d is None:
        return []
    out = [f'needs {req}: pip install "{req}" (resolves {code}; the prescription was judged with it)'
           for req, code in d.pins]
    out += [f"first: {f.code}: {f.fix or f.message}" for f in d.findings if f.severity.value != "info"]
    return out


def render_python(items: Sequence[Any], gpu: Any) -> str:
    """Paste-able Python only: every section of every prescribed model, each section self-contained."""
    from gemma_doctor.plan.recommend import python_snippets
    from gemma_doctor.render.style import printable

    out: list[str] = []
    for item in items:
        rec = item.recommendation
        if not item.prescribed or rec is None:
            out.append(f"# gemma-doctor recommend: {_name(item)}\n# no run passes check; the way out:\n"
                       + "".join(f"#   - {printable(w)}\n" for w in item.decision.way_out))
            continue
        out.append(f"# gemma-doctor recommend: {_name(item)}\n# {printable(rec.summary)}\n"
                   + "".join(f"# {printable(p)}\n" for p in _pins(item)))
        for key, code in python_snippets(rec, item.model_id).items():
            out.append(f"# --- {SECTION_TITLES[key]} ---\n{code}")
    return "\n".join(out)


def render_yaml(items: Sequence[Any], gpu: Any) -> str:
    """The prescribed run as one training-config document per model (axolotl's keys, which check --training-config
    reads back as the same run); several models are separate documents."""
    from gemma_doctor.plan.recommend import training_config_yaml
    from gemma_doctor.render.style import printable

    docs: list[str] = []
    for item in items:
        rec = item.recommendation
        if not item.prescribed or rec is None:
            docs.append(f"# gemma-doctor recommend: {_name(item)}\n# no run passes check; the way out:\n"
                        + "".join(f"#   - {printable(w)}\n" for w in item.decision.way_out))
            continue
        text = item.decision.training_config if item.decision is not None else training_config_yaml(rec)
        docs.append(f"# gemma-doctor recommend: {_name(item)}\n# {printable(rec.summary)}\n"
                    + "".join(f"# {printable(p)}\n" for p in _pins(item)) + text)
    return "---\n".join(docs)


def with_verdicts(text: str, rehearsed: Optional[Sequence[Optional[tuple[str, str]]]], prefix: str) -> str:
    """``text`` and after it each rehearsal's verdict (``recommend --rehearse``), one line each behind ``prefix`` (a
    comment mark keeps the Python and YAML views pasteable); ``text`` as it is where nothing was rehearsed."""
    said = "".join(f"{prefix}{name}: {verdict}\n" for name, verdict in filter(None, rehearsed or ()))
    return text if not said else text.rstrip("\n") + "\n" + said


def render_json(items: Sequence[Any], gpu: Any, task: str,
                rehearsed: Optional[Sequence[Optional[tuple[str, str]]]] = None) -> str:
    """The stable JSON document (docs/precision.md); rehearsed (``recommend --rehearse``): each model's verdict under
    "rehearsal" (null where nothing was prescribed)."""
    from gemma_doctor.render.jsonout import dumps

    # check-jsonschema's shape: the outcome first, as the exit code tells it (0 ok, 1 no prescription for some model).
    status = "ok" if all(i.prescribed for i in items) else "no-prescription"
    models = []
    for i in items:
        entry = i.to_json()
        entry["status"] = "prescribed" if i.prescribed else "no-prescription"
        models.append(entry)
    if rehearsed is not None:
        for entry, verdict in zip(models, rehearsed):
            entry["rehearsal"] = verdict[1].removeprefix("rehearsed: ") if verdict else None
    return dumps({"schema_version": 1, "command": "recommend", "status": status, "task": task, "gpu": gpu.to_json(),
                  "models": models})


def render_text(items: Sequence[Any], gpu: Any, color: bool) -> str:
    """Human summary: the decision, its reasons and notes, then the Python snippets."""
    from gemma_doctor.render.style import escape

    from gemma_doctor.plan.recommend import python_snippets
    from gemma_doctor.render.style import to_string

    lines: list[Any] = []
    for item in items:
        rec = item.recommendation
        lines.append(f"[bold]{escape(_name(item))}[/bold]  [dim]{escape(item.family or '')}[/dim]")
        if not item.prescribed:
            lines.extend(_no_prescription(item, escape))
            continue
        lines.append(f"  [bold green]precision {escape(rec.precision)}[/]  {escape(rec.summary.split(': ', 1)[-1])}")
        lines.append("  why:")
        lines.extend(f"    - {escape(r)}" for r in rec.reasons)
        for n in rec.notes:
            lines.append(f"  [yellow]note:[/] {escape(n)}")
        lines.extend(f"  [bold yellow]{escape(p)}[/]" for p in _pins(item) if not p.startswith("first: "))
        mem = getattr(item, "memory", None)
        if mem is not None:
            from gemma_doctor.plan.memory import components_line

            colour = {"fits": "green", "tight": "yellow"}.get(mem.plan.verdict, "red")
            fallback = getattr(item.decision, "trainer_fallback", None) if item.decision is not None else None
            lines.append(f"  [bold]trainer[/] {escape(rec.trainer)}: the run as "
                         f"{escape(trainer_words(rec))}"
                         + (f" ({escape(fallback)})" if fallback else ""))
            lines.append(f"  [bold {colour}]memory[/] {escape(mem.plan.summary())}")
            lines.append(f"    {escape(components_line(mem.plan.components))}")
            for f in (item.decision.findings if item.decision is not None else ()):
                if f.severity.value != "info":
                    lines.append(f"  [yellow]first:[/] {escape(f.code)} {escape(f.fix or f.message)}")
            if not mem.choice.fits and mem.choice.reason:
                lines.append(f"    {escape(mem.choice.reason)}")
            lines.append("    [dim]assumed: " + escape("; ".join(mem.plan.assumptions)) + "[/dim]")
        serve = rec.frameworks.get("serving") or {}
        if serve.get("dtype"):
            lines.append(f"  [bold]serve[/] in {escape(serve['dtype'])} ({escape(serve['reason'])}): vLLM "
                         f"{escape(serve['vllm'])}; transformers dtype=torch.{escape(serve['dtype'])}")
        elif serve.get("reason"):
            lines.append(f"  [bold]serve[/]: {escape(serve['reason'])}")
        lines.append("")
        for key, code in python_snippets(rec, item.model_id).items():
            lines.append(f"  [dim]# {escape(SECTION_TITLES[key])}[/dim]")
            lines.extend("  " + escape(line) if line else "" for line in code.rstrip("\n").splitlines())
            lines.append("")
        from gemma_doctor.plan.recommend import RUN_FILE, run_command, told_seq_len

        command, seq = run_command(rec), told_seq_len(rec)
        # The TrainingArguments format states no sequence: check is told it, and the user's script tokenizes to it.
        reads = f"check --training-config {RUN_FILE}" + (f" --seq-len {seq}" if seq else "") + " reads it"
        start = command or (f"your training script, tokenizing to {seq} tokens" if seq else None)
        lines.append(f"  [dim]the run as {escape(trainer_words(rec))} ({escape(reads)}): gemma-doctor recommend ... "
                     f"--format yaml > {RUN_FILE}" + (f"; start it: {escape(start)}" if start else "") + "[/dim]")
        from gemma_doctor.plan.recommend import other_trainers_run

        if other_trainers_run(rec):
            lines.append("  [dim]TRL's SFTTrainer is another run (chunked log-probs: no full logits held): its own "
                         "prescription and memory line with --trainer trl[/dim]")
        lines.append("")
    return to_string(lines, color, width=160)


def _no_prescription(item: Any, escape: Any) -> list[str]:
    """No run passes check: what check said of the nearest run, and the way out."""
    d = item.decision
    out = ["  [bold red]no prescription[/]: no run passes gemma-doctor check on this GPU and stack"]
    if item.memory is not None:
        out.append(f"  nearest run: {escape(item.memory.plan.summary())}")
    for f in d.blocking:
        out.append(f"    [red]{escape(f.severity.value.upper())}[/] {escape(f.code)} {escape(f.message)}")
    out.append("  way out (any one of):")
    out.extend(f"    - {escape(w)}" for w in d.way_out)
    out.append("")
    return out
