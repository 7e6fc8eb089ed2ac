"""`--format github`: GitHub Actions workflow commands, so findings appear as annotations on the run and the diff."""

from __future__ import annotations

import os
from pathlib import Path

from gemma_doctor.codes import CODES
from gemma_doctor.report import FailOn, Finding, ModelReport, Report, Severity

# Annotation levels GitHub knows; info findings become notices.
LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def escape_data(text: str) -> str:
    """The Actions toolkit's escapeData: % CR LF in a command's message; then every other control character made
    visible, as logs are read on terminals (and a raw ESC would reach them)."""
    from gemma_doctor.render.style import printable

    return printable(text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A"))


def escape_property(text: str) -> str:
    """The Actions toolkit's escapeProperty: escapeData plus : and , in a property value."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def command(name: str, properties: dict[str, object], message: str) -> str:
    """One workflow command line, ``::name key=value,...::message`` (empty properties are left out, as the toolkit does)."""
    props = ",".join(f"{k}={escape_property(str(v))}" for k, v in properties.items() if v not in (None, ""))
    return f"::{name}{' ' + props if props else ''}::{escape_data(message)}"


def _at_training_config(f: Finding, training_config: str | None) -> bool:
    """The finding points at a setting of the training config (its code's site says it may, and its file is that
    config): GD640 without a training config names the model's config.json, which lies in the snapshot."""
    code = CODES.get(f.code)
    return code is not None and code.at_training_config(f.file, training_config)


def _file(model: ModelReport, f: Finding, training_config: str | None = None) -> str | None:
    """The annotated file: training configs as given, model files under the model folder, relative when possible."""
    if not f.file:
        return None
    path = Path(f.file)
    # The training config is relative to the working directory as the user wrote it, never to the snapshot.
    if path.is_absolute() or _at_training_config(f, training_config):
        full = path
    else:
        full = Path(model.path) / f.file
    # GitHub matches annotations against repository-relative paths; the workspace is the working directory.
    try:
        rel = os.path.relpath(full)
    except ValueError:  # another drive on Windows
        return str(full)
    return str(full) if rel.startswith("..") else rel


def annotation(model: ModelReport, f: Finding, training_config: str | None = None) -> str:
    """The workflow command for one finding (``training_config``: the --training-config path as given)."""
    code = CODES.get(f.code)
    title = f"{f.code} {code.name}" if code else f.code
    where = f"{f.key}: " if f.key else ""
    text = f"{model.repo_id or model.path}: {where}{f.message}"
    if f.fix:
        text += f"\nfix: {f.fix}"
    # A line number belongs to the training config's setting; a model file's finding has none.
    line = f.details.get("line") if isinstance(f.details, dict) and _at_training_config(f, training_config) else None
    return command(LEVEL[f.severity], {"file": _file(model, f, training_config), "line": line, "title": title}, text)


def render_report(report: Report, fail_on: FailOn) -> str:
    """`check --format github`: one annotation per finding (each repeated one once), then a plain summary line."""
    lines: list[str] = []
    seen: set[str] = set()
    tc = report.environment.get("training_config")
    config_path = tc.get("path") if isinstance(tc, dict) else None
    for m in report.models:
        for f in m.findings:
            # A training-config finding is judged per model but names one file line: annotate it once. A finding
            # in a model's own files is that model's, whatever another model's says.
            cmd = annotation(m, f, config_path)
            key = cmd.split("::", 2)[1] + f.message if _at_training_config(f, config_path) else cmd
            if key in seen:
                continue
            seen.add(key)
            lines.append(cmd)
    counts = {s: 0 for s in Severity}
    for f in report.all_findings():
        counts[f.severity] += 1
    verdict = "FAIL" if report.failed(fail_on) else "OK"
    lines.append(f"gemma-doctor: {verdict} {len(report.models)} model(s): {counts[Severity.ERROR]} error(s), "
                 f"{counts[Severity.WARNING]} warning(s), {counts[Severity.INFO]} info (--fail-on {fail_on.value})")
    return "\n".join(lines) + "\n"
