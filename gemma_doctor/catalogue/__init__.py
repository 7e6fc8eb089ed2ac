"""The field catalogue: failures Gemma users reported in public trackers, triaged, as data (field.json).

Each entry names its reports, the stack component, the version window per package (PEP 440), the condition under
which it strikes (a predicate over the facts the doctor reads, evaluated by gemma_doctor/rules/catalogue.py), the
cure, a triage status and whether it is detectable before the run. Entries with a condition carry a stable finding
code (GD7xx) so a user can suppress one entry; entries without one are kept for the record and for recall.

Loaded lazily, on the first Gemma model a `check` diagnoses (a few ms of JSON), never at import.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping  # isinstance in C (typing.Mapping's checks through Python per call)
from pathlib import Path
from typing import Any

FILE = Path(__file__).with_name("field.json")

TRIAGE = ("reproduced", "verified-in-source", "cited")
STAGES = ("load", "train", "eval", "merge", "serve", "export")
DETECTABLE = ("yes", "partly", "no")
SEVERITIES = ("error", "warning", "info")
# The clauses a condition may hold (rules/catalogue.py evaluates each).
CLAUSES = ("model_type", "packages", "config", "tokenizer", "training", "gpu", "any")
TOKENIZER_FIELDS = ("has_chat_template", "template_has_generation", "add_bos_token", "template_emits_bos")
GPU_FIELDS = ("native_bf16",)
_CODE = re.compile(r"^GD7\d\d$")
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_REQUIRED = ("id", "title", "symptom", "component", "area", "stage", "sources", "triage", "evidence", "detectable",
             "cure")


@functools.lru_cache(maxsize=1)
def load() -> dict[str, Any]:
    """The catalogue document (``presets`` and ``entries``), read once per process."""
    return json.loads(FILE.read_text(encoding="utf-8"))


def entries() -> list[dict[str, Any]]:
    """Every triaged entry, in file order."""
    return list(load()["entries"])


def coded() -> list[dict[str, Any]]:
    """The entries that raise a finding: those with a condition and a code."""
    return [e for e in entries() if e.get("code")]


def example_config(example: Mapping[str, Any]) -> dict[str, Any]:
    """The config.json of an entry's example: a preset name (``"gemma3"``) or an inline dict, with ``config_patch``."""
    import copy

    config = example.get("config", "gemma3")
    base = copy.deepcopy(load()["presets"][config] if isinstance(config, str) else config)
    for dotted, value in (example.get("config_patch") or {}).items():
        node = base
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return base


def problems(doc: Mapping[str, Any] | None = None) -> list[str]:
    """Why the catalogue does not hold to its schema (empty when it does)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    doc = load() if doc is None else doc
    out: list[str] = []
    if not isinstance(doc.get("presets"), dict) or not isinstance(doc.get("entries"), list):
        return ["the document needs a `presets` object and an `entries` list"]
    seen_ids: set[str] = set()
    seen_codes: dict[str, str] = {}
    for i, e in enumerate(doc["entries"]):
        where = f"entry {i} ({e.get('id', '?')})"
        for key in _REQUIRED:
            if not e.get(key):
                out.append(f"{where}: `{key}` is missing or empty")
        if e.get("id") in seen_ids:
            out.append(f"{where}: id repeated")
        seen_ids.add(e.get("id"))
        if e.get("triage") not in TRIAGE:
            out.append(f"{where}: triage {e.get('triage')!r} is not one of {TRIAGE}")
        if e.get("stage") not in STAGES:
            out.append(f"{where}: stage {e.get('stage')!r} is not one of {STAGES}")
        if e.get("detectable") not in DETECTABLE:
            out.append(f"{where}: detectable {e.get('detectable')!r} is not one of {DETECTABLE}")
        for s in e.get("sources") or []:
            if not (isinstance(s, dict) and s.get("ref") and str(s.get("url", "")).startswith("https://")):
                out.append(f"{where}: a source needs `ref` and an https `url`")
        for pkg, spec in (e.get("windows") or {}).items():
            try:
                SpecifierSet(spec)
            except InvalidSpecifier:
                out.append(f"{where}: window {pkg} {spec!r} is not a PEP 440 specifier")
        when, code = e.get("when"), e.get("code")
        if bool(when) != bool(code):
            out.append(f"{where}: an entry has a condition and a code, or neither")
        scope = e.get("model_types")
        if scope is not None:
            from gemma_doctor.family import known_model_types

            if not (isinstance(scope, list) and scope and all(t in known_model_types() for t in scope)):
                out.append(f"{where}: model_types must be a non-empty list of known model types")
        for cover in e.get("covered_by") or []:
            if not re.fullmatch(r"GD\d{3}", cover):
                out.append(f"{where}: covered_by {cover!r} is not a code")
        if not code:
            continue
        if not _CODE.match(code):
            out.append(f"{where}: code {code!r} is not in the catalogue's range GD700-GD799")
        if code in seen_codes:
            out.append(f"{where}: code {code} also used by {seen_codes[code]}")
        seen_codes[code] = e.get("id", "?")
        if not _NAME.match(e.get("name") or ""):
            out.append(f"{where}: a coded entry needs a kebab-case `name`")
        if e.get("severity") not in SEVERITIES:
            out.append(f"{where}: severity {e.get('severity')!r} is not one of {SEVERITIES}")
        if e.get("detectable") == "no":
            out.append(f"{where}: an entry with a condition cannot be undetectable")
        out.extend(f"{where}: {p}" for p in _when_problems(when))
        packages = set((when or {}).get("packages") or {})
        if packages != set(e.get("windows") or {}):
            out.append(f"{where}: `windows` must name the packages of the condition, with the same specifiers")
        elif any(e["windows"][p] != when["packages"][p] for p in packages):
            out.append(f"{where}: `windows` and the condition's packages disagree")
        ex = e.get("examples") or {}
        for kind in ("positive", "negative"):
            if not isinstance(ex.get(kind), dict):
                out.append(f"{where}: examples.{kind} is missing")
            elif isinstance(ex[kind].get("config", "gemma3"), str) and ex[kind].get("config", "gemma3") not in doc["presets"]:
                out.append(f"{where}: examples.{kind} names an unknown preset")
    return out


def _when_problems(when: Any, depth: int = 0) -> list[str]:
    if not isinstance(when, dict) or not when:
        return ["`when` must be a non-empty object"]
    out = [f"unknown clause {k!r}" for k in when if k not in CLAUSES]
    if "model_type" in when and not (isinstance(when["model_type"], list) and when["model_type"]):
        out.append("`model_type` must be a non-empty list")
    for k in ("config", "training", "tokenizer", "gpu", "packages"):
        if k in when and not isinstance(when[k], dict):
            out.append(f"`{k}` must be an object")
    out.extend(f"tokenizer field {f!r} is not read" for f in (when.get("tokenizer") or {}) if f not in TOKENIZER_FIELDS)
    out.extend(f"gpu field {f!r} is not read" for f in (when.get("gpu") or {}) if f not in GPU_FIELDS)
    for k in ("config", "training", "tokenizer", "gpu"):
        for key, m in (when.get(k) or {}).items() if isinstance(when.get(k), dict) else ():
            try:
                match(m, MISSING)
            except (ValueError, TypeError):
                out.append(f"{k}.{key}: {m!r} is not a matcher")
    if "training" in when:
        from gemma_doctor.readers.training_config import KEYS

        out.extend(f"training setting {s!r} is not read (readers/training_config.KEYS)" for s in when["training"]
                   if s not in KEYS)
    if "any" in when:
        if depth or not isinstance(when["any"], list) or len(when["any"]) < 2:
            out.append("`any` holds two or more conditions, one level deep")
        else:
            for sub in when["any"]:
                if isinstance(sub, dict) and "packages" in sub:
                    out.append("`any` alternatives do not hold packages")
                out.extend(_when_problems(sub, depth + 1))
    return out


# --- the matchers of a condition: what rules/catalogue.py applies to each value the facts hold --------------

# A key the facts do not hold (distinct from every JSON value, null included).
MISSING = object()


def _norm(v: Any) -> Any:
    return v.strip().lower().replace("torch.", "") if isinstance(v, str) else v


def _truthy(v: Any) -> bool:
    from gemma_doctor.readers.training_config import truthy

    return truthy(v)


def match(matcher: Any, value: Any) -> bool:
    """Whether a value (``MISSING`` when the key is absent) satisfies a catalogue matcher.

    ``true``/``false``: set and (not) truthy; ``"absent"``/``"present"``; a string or number: equal (strings without
    case or a ``torch.`` prefix); ``{"in": [...]}`` (null: absent counts), ``{"not_in": [...]}`` (absent passes),
    ``{"gte"|"gt"|"lte"|"lt": n}``, ``{"contains": s}`` / ``{"lacks": s}`` (a string, or any item of a list).
    """
    missing = value is MISSING
    if matcher is True:
        return not missing and _truthy(value)
    if matcher is False:
        return not missing and not _truthy(value)
    if matcher == "absent":
        return missing
    if matcher == "present":
        return not missing
    if isinstance(matcher, (str, int, float)):
        return not missing and _norm(value) == _norm(matcher)
    if isinstance(matcher, Mapping) and len(matcher) == 1:
        (op, arg), = matcher.items()
        if op == "in":
            return (None in arg) if missing else _norm(value) in [_norm(a) for a in arg]
        if op == "not_in":
            return missing or _norm(value) not in [_norm(a) for a in arg]
        if op in ("gte", "gt", "lte", "lt"):
            if missing or isinstance(value, bool) or not isinstance(value, (int, float)):
                return False
            return {"gte": value >= arg, "gt": value > arg, "lte": value <= arg, "lt": value < arg}[op]
        if op in ("contains", "lacks"):
            items = [] if missing else (value if isinstance(value, list) else [value])
            found = any(isinstance(i, str) and arg.lower() in i.lower() for i in items)
            return found if op == "contains" else not found
    raise ValueError(f"unknown matcher {matcher!r}")


# --- renderings: docs/findings.md's catalogue section and codes.py's block are generated from the entries --------

DOCS_BEGIN = "<!-- BEGIN field catalogue: generated by `python docs/gen_catalogue.py`, do not edit -->"
DOCS_END = "<!-- END field catalogue -->"
CODES_BEGIN = "    # BEGIN field catalogue: generated by `python docs/gen_catalogue.py`, do not edit"
CODES_END = "    # END field catalogue"


def _site(when: Mapping[str, Any]) -> str:
    """The codes.Site of an entry's findings, as rules/catalogue.py's _where points them: a config.json or
    tokenizer_config.json key (the model), else the training config's setting, else nothing."""
    if when.get("config") or when.get("tokenizer"):
        return "MODEL"
    return "RUN" if when.get("training") else "NONE"


# The run setting (a key of a condition's "training" clause) that says how many micro-batches a step accumulates.
ACCUMULATION = "gradient_accumulation_steps"


def _on_accumulation(when: Mapping[str, Any]) -> bool:
    """Whether an entry's condition needs the run to accumulate: a run of one micro-batch per step does not meet it
    (codes.Code.accumulation)."""
    training = when.get("training") or {}
    return ACCUMULATION in training and not match(training[ACCUMULATION], 1)


def render_codes() -> str:
    """The GD7xx lines of gemma_doctor/codes.py."""
    lines = [CODES_BEGIN, "    # GD7xx: the field catalogue (gemma_doctor/catalogue/field.json)"]
    for e in sorted(coded(), key=lambda e: e["code"]):
        args = ", ".join(json.dumps(e[k], ensure_ascii=False) for k in ("code", "name", "title"))
        site = _site(e["when"])
        accumulation = ", accumulation=True" if _on_accumulation(e["when"]) else ""
        lines.append(f"    Code({args}{'' if site == 'MODEL' else ', site=Site.' + site}{accumulation}),")
    lines.append(CODES_END)
    return "\n".join(lines)


def _window_text(e: Mapping[str, Any]) -> str:
    windows = e.get("windows") or {}
    return "; ".join(f"{p} `{s}`" for p, s in windows.items()) if windows else "none (a setting, not a release)"


def render_docs() -> str:
    """The catalogue section of docs/findings.md: every coded entry under its code, by area."""
    out = [DOCS_BEGIN, "## GD7xx: the field catalogue (failures reported in public trackers)", "",
           "Generated from `gemma_doctor/catalogue/field.json` (one entry per reported failure, triaged). A finding",
           "is an **error** when every version window of the entry is hit (the stack's exposure is AFFECTED), a",
           "**warning** when a window cannot be decided (UNKNOWN: not installed and not named, or a range that",
           "straddles it); a package the run does not use (not installed, not named with `--with`/`--requirements`)",
           "leaves the entry out, except transformers and torch. Serving engines that are not pip packages are named",
           "the same way: `--with text-generation-inference==3.2.0`, `--with ollama==0.5.13`. Entries without a",
           "condition (not detectable from files, versions and config) are listed in",
           "[field-recall.md](field-recall.md).", ""]
    for e in sorted(coded(), key=lambda e: e["code"]):
        refs = ", ".join(f"[{s['ref']}]({s['url']})" for s in e["sources"])
        out += [f"### {e['code']} {e['name']}",
                f"Severity: {e['severity']} ({e['area']}, {e['stage']}; triage: {e['triage']}). {e['title']}.",
                f"Symptom: `` {e['symptom']} ``. Window: {_window_text(e)}. Fix: {e['cure']}",
                f"Evidence: {e['evidence']} Sources: {refs}.", ""]
    out.append(DOCS_END)
    return "\n".join(out)


SUMMARY_BEGIN = "<!-- BEGIN catalogue summary: generated by `python docs/gen_catalogue.py`, do not edit -->"
SUMMARY_END = "<!-- END catalogue summary -->"


def _caught(group: list[dict[str, Any]]) -> int:
    """How many entries raise a finding: their own condition and code, or the earlier codes they name."""
    return sum(1 for e in group if e.get("code") or e.get("covered_by"))


def render_summary() -> str:
    """The catalogue by area, triage and detectability, and every entry in one table (docs/field-recall.md)."""
    from collections import Counter

    all_entries = entries()
    triage = Counter(e["triage"] for e in all_entries)
    detect = Counter(e["detectable"] for e in all_entries)
    yes = [e for e in all_entries if e["detectable"] == "yes"]
    partly = [e for e in all_entries if e["detectable"] == "partly"]
    out = [SUMMARY_BEGIN,
           f"{len(all_entries)} entries: {triage['reproduced']} reproduced, {triage['verified-in-source']} verified in "
           f"released wheels' source, {triage['cited']} cited. Detectable before the run from files, versions and config: "
           f"{detect['yes']} yes, {detect['partly']} partly, {detect['no']} no. {len(coded())} carry a condition and a "
           f"code (GD7xx); {sum(1 for e in all_entries if e.get('covered_by'))} are caught by an earlier finding "
           "(`covered_by`).", "",
           f"Recall over the catalogue: {_caught(yes)} of the {len(yes)} entries triaged detectable (yes) raise a finding "
           f"(their own GD7xx, whose positive and negative examples tests/test_catalogue.py runs through `check`, or the "
           f"earlier codes they name); of the {len(partly)} partly detectable, {_caught(partly)} do. Caught means a "
           "condition or a `covered_by` code: computed from the catalogue by docs/gen_catalogue.py, never typed.", "",
           "| area | entries | with a GD7xx condition | covered by an earlier code | neither | detectable (yes) caught "
           "| partly caught |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    areas = sorted({e["area"] for e in all_entries})
    for area in areas:
        group = [e for e in all_entries if e["area"] == area]
        own = sum(1 for e in group if e.get("code"))
        cov = sum(1 for e in group if not e.get("code") and e.get("covered_by"))
        g_yes = [e for e in group if e["detectable"] == "yes"]
        g_part = [e for e in group if e["detectable"] == "partly"]
        out.append(f"| {area} | {len(group)} | {own} | {cov} | {len(group) - own - cov} | "
                   f"{_caught(g_yes)} / {len(g_yes)} | {_caught(g_part)} / {len(g_part)} |")
    out += ["", "| entry | component | stage | triage | detectable | finding | first report |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for e in all_entries:
        finding = e.get("code") or ("(" + ", ".join(e["covered_by"]) + ")" if e.get("covered_by") else "-")
        first = e["sources"][0]
        out.append(f"| {e['id']} | {e['component']} | {e['stage']} | {e['triage']} | {e['detectable']} | {finding} | "
                   f"[{first['ref']}]({first['url']}) |")
    out.append(SUMMARY_END)
    return "\n".join(out)
