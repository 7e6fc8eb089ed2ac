"""Views of a rehearsal (gemma_doctor/rehearse/runner.py's Rehearsal): plain text and JSON. Return strings."""

from __future__ import annotations

import json
from typing import Any

from gemma_doctor.render.style import printable


def _fmt(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def _rank_summary(s: dict[str, Any]) -> str:
    """One line of figures for a stage of one rank (gemma_doctor/rehearse/ranks.py)."""
    stage = s.get("stage")
    if stage == "load":
        return f"{s.get('cls')} {str(s.get('dtype', '')).removeprefix('torch.')}"
    if stage == "wrap":
        return (f"FSDP{s.get('version')} {s.get('policy')} ({', '.join(s.get('classes') or [])}: {s.get('wrapped')} "
                f"units), {s.get('sharding')}, {str(s.get('state_dict_type')).split('.')[-1]}"
                + (", activation checkpointing" if s.get("activation_checkpointing") else ""))
    if stage == "train":
        losses = s.get("losses") or []
        return f"loss {_fmt(losses[0])} -> {_fmt(losses[-1])}" if losses else "no loss"
    if stage == "agree":
        return f"full state gathered: {s.get('tensors')} tensors, digest {s.get('digest')}"
    if stage == "save":
        return ", ".join(s.get("files") or []) or "nothing written"
    if stage == "reload":
        if s.get("why"):
            return str(s["why"])
        return (f"{s.get('state_dict_type')} reloaded on one process: logits within {_fmt(s.get('max_abs_diff'))} "
                f"(largest {_fmt(s.get('scale'))})")
    return ""


def _summary(s: dict[str, Any]) -> str:
    """One line of figures for a stage that passed."""
    stage = s.get("stage")
    if "rank" in s:
        return _rank_summary(s)
    if stage == "twin":
        shrunk = s.get("shrunk") or {}
        return ", ".join(f"{k} {v}" for k, v in list(shrunk.items())[:3]) + (" ..." if len(shrunk) > 3 else "")
    if stage == "load":
        return f"{s.get('cls')} {str(s.get('dtype', '')).removeprefix('torch.')}, {s.get('parameters', 0):,} parameters"
    if stage == "setup":
        rewards = f", rewards {', '.join(s['rewards'])}" if s.get("rewards") else ""
        return f"{s.get('trainer')}, {s.get('trainable', 0):,} trainable parameters{rewards}"
    if stage == "labels":
        rows = s.get("per_sample") or []
        trained = [r["trained"] for r in rows]
        return f"{len(rows)} samples, {min(trained, default=0)}-{max(trained, default=0)} tokens trained each"
    if stage == "train":
        losses, norms = s.get("losses") or [], s.get("grad_norms") or []
        loss = f"loss {_fmt(losses[0])} -> {_fmt(losses[-1])}" if losses else "no loss logged"
        norm = f"grad norm {_fmt(min(norms))}-{_fmt(max(norms))}" if norms else "no grad norm"
        return f"{loss}, {norm}, {s.get('moved')}/{s.get('trainable')} trainable tensors moved" + _rollouts(s)
    if stage == "eval":
        return f"eval loss {_fmt(s.get('eval_loss'))}"
    if stage == "generate":
        same = s.get("cached") == s.get("uncached")
        return "the same tokens with and without the KV cache" if same else "other tokens without the KV cache"
    if stage == "save":
        return f"reloaded logits within {_fmt(s.get('max_abs_diff'))} (largest {_fmt(s.get('scale'))})"
    if stage == "merge":
        merged, reloaded = s.get("merged") or {}, s.get("reloaded") or {}
        return (f"merged vs base + adapter {_fmt(merged.get('max_abs_diff'))}, "
                f"reloaded merged folder {_fmt(reloaded.get('max_abs_diff'))}")
    if stage == "real-weights":
        peak = s.get("peak_bytes") or 0
        over = f"fp16 overflow first at {s.get('first_overflow')}" if s.get("fp16_overflow") else \
            f"fp16 headroom x{_fmt(s.get('fp16_headroom'))}"
        planned = s.get("plan_tensor_bytes")
        against = f" against the plan's {planned / 1024**3:.2f} GiB (x{peak / planned:.2f})" \
            if isinstance(planned, int) and planned > 0 else ""
        return (f"{s.get('device')}: peak {peak / 1024**3:.2f} GiB ({s.get('peak_source')}){against}, largest "
                f"activation {_fmt(s.get('act_absmax'))}, largest gradient {_fmt(s.get('grad_absmax'))}, {over}")
    if stage == "accumulation":
        return (f"loss {_fmt(s.get('accumulated_loss'))} ({s.get('micro')} x {s.get('k')}) vs "
                f"{_fmt(s.get('whole_loss'))} (one batch)")
    return ""


def _rollouts(s: dict[str, Any]) -> str:
    """A GRPO run's rollouts in a clause: completions, their lengths, the rewards' range ("" for other runs)."""
    rollouts = (s.get("rollouts") or {}).get("rollouts") or []
    lengths = [n for r in rollouts for n in r.get("lengths", [])]
    if not lengths:
        return ""
    rewards = [x for r in rollouts for row in r.get("rewards", []) for x in row if isinstance(x, (int, float))]
    span = f", rewards {_fmt(min(rewards))}-{_fmt(max(rewards))}" if rewards else ""
    return f"; {len(lengths)} completions of {min(lengths)}-{max(lengths)} tokens{span}"


# Keys of the child's stack record that are not library versions: where it ran.
NOT_LIBRARIES = ("python", "device", "device_error", "gpu", "compute_capability")


def where(stack: dict[str, Any]) -> str:
    """Where the twin trained, as a clause of the header ("" where the child recorded no device: an older plan)."""
    if stack.get("device") == "cuda":
        return f"; on {printable(str(stack.get('gpu', 'a GPU')))} (compute capability {stack.get('compute_capability')})"
    if stack.get("device_error"):
        return f"; on the CPU ({printable(str(stack['device_error']))})"
    return "; on the CPU" if stack.get("device") == "cpu" else ""


def render_text(rehearsal: Any) -> str:
    """The text view: the stack, one line per stage, the findings with their cures, the verdict."""
    stack = rehearsal.stack
    libs = ", ".join(f"{k} {v}" for k, v in stack.items() if v and k not in NOT_LIBRARIES)
    lines = [f"rehearsal of {rehearsal.repo_id} ({rehearsal.target}), {rehearsal.trainer} run"
             + (f": {libs}" if libs else "") + where(stack)]
    for s in rehearsal.stages:
        status = s.get("status")
        text = _summary(s) if status == "ok" else s.get("reason", "") if status == "skipped" else s.get("line", "")
        name = f"{s.get('stage', '?')}" + (f" [{s['rank']}]" if "rank" in s else "")
        lines.append(f"  {name:<12} {status:<8} {printable(str(text))}")
    if rehearsal.findings:
        lines.append("findings:")
        for f in rehearsal.findings:
            lines.append(f"  {f.code} {f.severity.value:<7} {printable(f.message)}")
            if f.fix:
                lines.append(f"      fix: {printable(f.fix)}")
    for note in rehearsal.notes:
        lines.append(f"note: {printable(note)}")
    verdict = "failed" if rehearsal.failed else "passed"
    lines.append(f"rehearsal {verdict} in {rehearsal.seconds:.0f} s")
    return "\n".join(lines) + "\n"


def render_json(rehearsals: list[Any]) -> str:
    """The JSON document of `rehearse --format json`."""
    doc = {"schema_version": 1, "status": "failed" if any(r.failed for r in rehearsals) else "passed",
           "rehearsals": [r.to_json() for r in rehearsals]}
    return json.dumps(doc, indent=2, default=str) + "\n"
