"""Frozen result types shared by every layer: severities, findings, per-model and whole reports."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any


# Where a finding's text names its model. A rule writes these instead of the name, so that its judgement reads no name
# and models whose facts are equal get equal findings (issue 32); the engine fills them in for the model a finding is
# about (Naming, pipeline.named) before any view, decision or caller meets it.
MODEL = "\u27e8model\u27e9"  # the target as typed: gemma-doctor recommend TARGET
MODEL_ARGS = "\u27e8model-args\u27e9"  # the target and its --revision / --cache-dir when not the defaults (command_args)
MODEL_REPO = "\u27e8model-repo\u27e9"  # the repo id, quoted for a shell: hf download REPO
MODEL_WHERE = "\u27e8model-where\u27e9"  # hf download's " --revision .. --cache-dir .." for it, or nothing
MODEL_ID = "\u27e8model-id\u27e9"  # the repo id as it is (the recommendation's model_id: axolotl's base_model)
_MARK = "\u27e8model"
PLACE = _MARK  # what every place for a name begins with (memo.py: a model's files holding one are judged directly)
_YAML_ID = json.dumps(MODEL_ID)  # MODEL_ID in a YAML scalar: "\\u27e8model-id\\u27e9"


@dataclass(frozen=True)
class Naming:
    """One model's names for the places its findings name it (``args``: made only when a text asks for it)."""

    target: str
    args: Any  # Callable[[], str]
    repo: Any = None  # Callable[[], str]
    where: Any = None  # Callable[[], str]
    ident: Any = None  # Callable[[], str]

    def text(self, s: str) -> str:
        """``s`` with the model's names in place of MODEL, MODEL_ARGS, MODEL_REPO, MODEL_WHERE and MODEL_ID."""
        if _MARK not in s:
            return s
        for mark, made in ((MODEL_ARGS, self.args), (MODEL_REPO, self.repo), (MODEL_WHERE, self.where),
                           (MODEL_ID, self.ident)):
            if mark in s and made is not None:
                s = s.replace(mark, made())
        return s.replace(MODEL, self.target)

    def value(self, v: Any) -> Any:
        """``v`` (strings in dicts, lists and tuples: a snippet's settings) naming the model; the same object when it
        names none."""
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, dict):
            pairs = [(k, self.value(x)) for k, x in v.items()]
            return v if all(x is v[k] for k, x in pairs) else dict(pairs)
        if isinstance(v, (list, tuple)):
            items = [self.value(x) for x in v]
            return v if all(a is b for a, b in zip(items, v)) else type(v)(items)
        return v

    def yaml(self, text: str | None) -> str | None:
        """A prescription's YAML naming the model: it writes a string as JSON does (plan.recommend._yaml_scalar), so
        the place for the model id is there as JSON escaped it."""
        if text is None or self.ident is None or _YAML_ID not in text:
            return text
        return text.replace(_YAML_ID, json.dumps(self.ident()))

    def finding(self, f: Finding) -> Finding:
        """``f`` naming the model (the same object when it names none)."""
        if _MARK not in f.message and (f.fix is None or _MARK not in f.fix):
            return f
        return Finding(f.code, f.severity, self.text(f.message), f.file, f.key,
                       self.text(f.fix) if f.fix is not None else None, f.details)


class Severity(str, enum.Enum):
    """How bad a finding is; ordered info < warning < error."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def rank(self) -> int:
        """Numeric order used for --fail-on comparisons."""
        return _RANK[self]


_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.ERROR: 2}


class FailOn(str, enum.Enum):
    """Threshold for a non-zero exit: findings at or above it fail the run."""

    ERROR = "error"
    WARNING = "warning"
    NEVER = "never"

    def fails(self, severity: Severity) -> bool:
        """True when a finding of ``severity`` should fail the run."""
        if self is FailOn.NEVER:
            return False
        return severity.rank >= Severity(self.value).rank


class ExitCode(enum.IntEnum):
    """Documented process exit codes (docs/usage.md); only the CLI (gemma_doctor/cli) turns them into exits."""

    OK = 0
    FINDINGS = 1
    USAGE = 2
    WRITE_FAILED = 3
    # A repo read from the Hub: gated and this token has no access (4); the Hub could not be asked (5).
    NO_ACCESS = 4
    HUB_UNREACHABLE = 5
    INTERRUPTED = 130
    INTERNAL = 70  # an unexpected exception: a bug (GEMMA_DOCTOR_DEBUG=1 shows the traceback)

    @property
    def meaning(self) -> str:
        """The short meaning docs/reference.md lists (README's exit-code table has the long one)."""
        return _EXIT_MEANINGS[self]


_EXIT_MEANINGS = {
    ExitCode.OK: "ok",
    ExitCode.FINDINGS: "findings at or above `--fail-on` (or a fix/restore left a file undone)",
    ExitCode.USAGE: "usage error (also `check` that found no Gemma-family model to check)",
    ExitCode.WRITE_FAILED: "a write failed",
    ExitCode.NO_ACCESS: "a gated Hub repo this token has no access to",
    ExitCode.HUB_UNREACHABLE: "the Hub could not be asked",
    ExitCode.INTERRUPTED: "interrupted",
    ExitCode.INTERNAL: "internal error (a bug: please report it)",
}


@dataclass(frozen=True)
class Finding:
    """One diagnosed problem (or fact worth telling) with where it is and what to do."""

    code: str
    severity: Severity
    message: str
    file: str | None = None
    key: str | None = None
    fix: str | None = None
    details: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str, Any]:
        """The stable JSON shape of a finding."""
        out: dict[str, Any] = {
            "code": self.code,
            "severity": self.severity.value,
            "message": self.message,
            "file": self.file,
            "key": self.key,
            "fix": self.fix,
        }
        if self.details:
            out["details"] = self.details
        return out


@dataclass(frozen=True)
class ModelReport:
    """Findings and facts for one snapshot (one revision of one model)."""

    target: str
    path: str
    repo_id: str | None
    revision: str | None
    commit: str | None
    family: str | None
    findings: tuple[Finding, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    # (view, text): the model as a view prints it ("text": the colourless text view's lines, render/text.with_block;
    # "json": its entry in the JSON document, render/jsonout.with_json), made where the model was judged (a
    # whole-cache scan's worker) so the scan does not make them one by one at the end; None elsewhere.
    block: tuple[str, str] | None = field(default=None, compare=False, repr=False)
    # check's own run (gemma_doctor.run.Run: the one the user asked about, resolved once per model) and the precision
    # decision's own clause (Recommendation.head): the text view's precision, trainer and memory lines render from
    # them; the JSON view of the Run is extra["run"]. None where no run was planned (not a Gemma, no shape).
    run: Any = field(default=None, compare=False, repr=False)
    precision: str | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        """The stable JSON shape of a model entry."""
        out: dict[str, Any] = {
            "target": self.target,
            "repo_id": self.repo_id,
            "revision": self.revision,
            "commit": self.commit,
            "path": self.path,
            "family": self.family,
            "findings": [f.to_json() for f in self.findings],
        }
        out.update(self.extra)
        return out


@dataclass(frozen=True)
class Report:
    """Everything one `check` run found, rendered by every output format alike."""

    models: tuple[ModelReport, ...]
    environment: dict[str, Any]
    skipped: tuple[dict[str, str], ...] = ()
    cache_dir: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    # Hints for stderr (a folder shadowing a cached repo, a cached copy behind the Hub); not part of the JSON.
    notes: tuple[str, ...] = ()

    def all_findings(self) -> list[Finding]:
        """Every finding of every model."""
        return [f for m in self.models for f in m.findings]

    def failed(self, fail_on: FailOn) -> bool:
        """True when some finding is at or above the --fail-on threshold."""
        return any(fail_on.fails(f.severity) for f in self.all_findings())

    def to_json(self, fail_on: FailOn, models: bool = True) -> dict[str, Any]:
        """The stable JSON document of `check --format json` (schema: docs/json-schema.md); ``models`` False: its
        "models" list left empty (render/jsonout puts the entries the scan's workers wrote there)."""
        counts = {s.value: 0 for s in Severity}
        for f in self.all_findings():
            counts[f.severity.value] += 1
        out: dict[str, Any] = {
            "schema_version": 1,
            "status": "fail" if self.failed(fail_on) else "ok",
            "fail_on": fail_on.value,
            "summary": {"models": len(self.models), "skipped": len(self.skipped), "findings": counts},
            "cache_dir": self.cache_dir,
            "models": [m.to_json() for m in self.models] if models else [],
            "skipped": list(self.skipped),
            "environment": self.environment,
        }
        out.update(self.extra)
        return out
