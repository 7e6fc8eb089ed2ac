"""An axolotl run's rows through axolotl's own code: the labels the rehearsal judges and the twin trains on are the ones
axolotl's prompt strategy makes from the config's `datasets:` entry (issue 34).

The parent side (``plan_part``, ``launch_config``, ``rehearse_cure``) imports nothing heavy and never imports axolotl:
it looks axolotl up in the environment that rehearses (the user's; nothing is installed). The child side (``data``)
runs in the rehearsal's child with the twin's tokenizer: ``axolotl.prompt_strategies.load`` (the registry axolotl's
dataset wrapper calls for a `type:`), ``TokenizedPromptDataset`` (its wrapper) and its ``DataCollatorForSeq2Seq``.
Before the rows, the whole config goes through axolotl's own validation (``validate_config``: its pydantic schema and
validators, what `axolotl train` runs first): a config axolotl refuses stops the rehearsal at setup with axolotl's
message, what it warns about is a note, and the keys the strategy reads take the values the schema gives them.
What is not axolotl's here: the trainer (transformers' Trainer: AxolotlTrainer is a subclass of it) and the
tokenizer's loading (axolotl's `load_tokenizer` needs the normalised config and its GPU probe).
"""

from __future__ import annotations

import importlib.util
import json
import shlex
from pathlib import Path
from typing import Any, Callable, Mapping

from gemma_doctor.report import Finding

# The top-level keys of an axolotl config that its prompt strategies read (StrategyLoader, get_chat_template_from_config
# in axolotl 0.19.0), with the defaults its schema gives them (utils/schemas/config.py, training.py).
_DEFAULTS: dict[str, Any] = {"sequence_len": 512, "train_on_inputs": False}
_KEYS = ("sequence_len", "train_on_inputs", "chat_template", "chat_template_jinja", "chat_template_kwargs",
         "eot_tokens", "default_system_message", "tokenizer_use_mistral_common")
# The turn terminator each Gemma generation's template ends a turn with: what the catalogue's cure
# (axolotl-gemma-eot-untrained) sets eot_tokens to.
_TERMINATORS = {"gemma4": "<turn|>"}


def importable() -> str | None:
    """The installed axolotl's version where this interpreter can import it (looked up, not imported), else None."""
    if importlib.util.find_spec("axolotl") is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("axolotl")
    except PackageNotFoundError:
        return "unknown"


def terminator(model_type: str) -> str:
    """The turn terminator of a model type's chat template."""
    return next((t for prefix, t in _TERMINATORS.items() if model_type.startswith(prefix)), "<end_of_turn>")


def launch_config(words: list[str]) -> Path | None:
    """The config an axolotl launch line trains (`axolotl train CFG`, `python -m axolotl.cli.train CFG`,
    `accelerate launch -m axolotl.cli.train CFG`), or None for another line."""
    start = None
    if words and Path(words[0]).name == "axolotl" and words[1:2] == ["train"]:
        start = 2
    for i, w in enumerate(words[:-1]):
        if w == "-m" and words[i + 1] == "axolotl.cli.train":
            start = i + 2
    if start is None:
        return None
    return next((Path(w) for w in words[start:] if not w.startswith("-")), None)


def axolotl_launch(launch: str) -> Path | None:
    """``launch_config`` of a launch command line (None where it does not parse: the caller says why)."""
    try:
        return launch_config(shlex.split(launch, comments=True))
    except ValueError:
        return None


def plan_part(raw: Mapping[str, Any], config_dir: Path | None,
              model_type: str) -> tuple[dict[str, Any] | None, str | None]:
    """(what the child needs to build the rows through axolotl, or None with the note that says why): the first
    `datasets:` entry, the top-level keys its strategy reads, the local dataset file where the entry names one."""
    version = importable()
    if version is None:
        return None, ("axolotl is not importable in this environment: its prompt strategy did not build the labels; "
                      "the run is rehearsed through transformers' Trainer with the config's keys gemma-doctor reads")
    entries = raw.get("datasets")
    entry = entries[0] if isinstance(entries, list) and entries and isinstance(entries[0], dict) else {}
    kind = entry.get("type") if isinstance(entry.get("type"), str) else None
    if kind is None:
        return None, ("the axolotl config names no dataset `type:` in its first `datasets:` entry: the labels are the "
                      "rehearsal's own, not axolotl's")
    data = None
    named = entry.get("path") or entry.get("data_files")
    if isinstance(named, str):
        for candidate in (Path(named), (config_dir or Path.cwd()) / named):
            if candidate.is_file() and candidate.suffix in (".jsonl", ".json"):
                data = str(candidate.absolute())
                break
    cfg = {**_DEFAULTS, **{k: raw[k] for k in _KEYS if raw.get(k) is not None}}
    part = {"version": version, "dataset": entry, "cfg": cfg, "rows": data, "terminator": terminator(model_type),
            "completion_only": not bool(cfg["train_on_inputs"]),
            # The whole config, for axolotl's own validation in the child (JSON: what YAML holds that JSON cannot, a
            # date or a key that is not a string, is written as text or left out).
            "config": json.loads(json.dumps(dict(raw), default=str, skipkeys=True))}
    return {**part, "eot_missing": eot_missing(part)}, None


def eot_missing(part: Mapping[str, Any]) -> bool:
    """The config leaves the template's turn terminator out of eot_tokens (the catalogue entry's condition)."""
    eot = (part.get("cfg") or {}).get("eot_tokens")
    return not (isinstance(eot, list) and part.get("terminator") in eot)


def cure(part: Mapping[str, Any]) -> dict[str, Any]:
    """The config change of the catalogue's cure: the template's turn terminator added to eot_tokens."""
    eot = (part.get("cfg") or {}).get("eot_tokens")
    eot = list(eot) if isinstance(eot, list) else []
    return {"eot_tokens": eot if part.get("terminator") in eot else [*eot, part.get("terminator")]}


def rehearse_cure(finding: Finding, plan: dict[str, Any],
                  run_child: Callable[[dict[str, Any]], tuple[list[dict[str, Any]], str | None]]) -> Finding:
    """GD972 of an axolotl run whose eot_tokens lacks the terminator: the labels rebuilt by axolotl with it added;
    whether every sample then trains its turn end ("cure verified in this stack") or not."""
    from dataclasses import replace

    from gemma_doctor.rehearse.invariants import judge_labels

    part = plan["axolotl"]
    stages = [s for s in plan["stages"] if s in ("load", "setup", "labels")]
    # The child adds the terminator of the template axolotl renders with (``_data``): the twin's may be another's.
    records, ended = run_child({**plan, "axolotl": {**part, "cure": True}, "stages": stages})
    labels = [r for r in records if r.get("stage") == "labels" and r.get("status") == "ok"]
    change = (labels[-1].get("axolotl") or {}).get("cured_with") if labels else None
    setting = f"eot_tokens: {json.dumps(change or cure(part)['eot_tokens'])}"
    if ended is None and labels and not any(f.code == "GD972" for f in judge_labels(labels[-1])):
        verdict = f"cure verified in this stack: with {setting} axolotl {part['version']} trains the turn end"
    else:
        verdict = f"the cure did not help in this stack: with {setting} the turn end stays untrained"
    return replace(finding, fix=f"{finding.fix}; {verdict}", details={**(finding.details or {}), "cure": verdict})


# -- the child's side ----------------------------------------------------------------------------------------------------
def _synthetic(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rehearsal's synthetic rows in the format the dataset entry reads."""
    from gemma_doctor.rehearse.rows import ROWS

    kind = str(entry.get("type", ""))
    if kind.startswith("alpaca"):
        return [{"instruction": q, "input": "", "output": a} for q, a in ROWS]
    if kind.startswith("completion"):
        return [{str(entry.get("field") or "text"): f"{q} {a}"} for q, a in ROWS]
    mapping = dict(entry.get("message_property_mappings") or {})
    role = mapping.get("role") or entry.get("message_field_role") or "role"
    content = mapping.get("content") or entry.get("message_field_content") or "content"
    roles = entry.get("roles") if isinstance(entry.get("roles"), dict) else {}

    def name(r: str) -> str:  # the dataset's own word for a role (`roles: {assistant: [gpt]}`)
        aliases = roles.get(r)
        return aliases[0] if isinstance(aliases, list) and aliases else r

    field = entry.get("field_messages") or "messages"
    return [{field: [{role: name("user"), content: q}, {role: name("assistant"), content: a}]} for q, a in ROWS]


def tokenized(part: Mapping[str, Any], tokenizer: Any, rows: list[dict[str, Any]],
              overrides: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """``rows`` through axolotl's prompt strategy for the config's dataset entry, as axolotl's dataset wrapper runs it."""
    from datasets import Dataset

    from axolotl.datasets import TokenizedPromptDataset
    from axolotl.prompt_strategies import load
    from axolotl.prompt_tokenizers import DatasetWrappingStrategy
    from axolotl.utils.dict import DictDefault

    cfg = DictDefault({**part["cfg"], **(overrides or {})})
    entry = DictDefault(dict(part["dataset"]))
    dataset = Dataset.from_list(rows)
    strategy = load(entry.type, tokenizer, cfg, entry)
    if strategy is None:
        # Not in the registry (alpaca, sharegpt-era names...): axolotl's dataset wrapper has a handler for it. It
        # imports axolotl's whole data stack (a telemetry client, datasets' extras), which the strategies do not.
        from axolotl.utils.data.wrappers import get_dataset_wrapper

        base, _, style = str(entry.type).partition(":")
        done, _ = get_dataset_wrapper(entry, tokenizer, cfg, base, dataset, style or None)
    else:
        done = strategy.wrap_dataset(dataset) if isinstance(strategy, DatasetWrappingStrategy) \
            else TokenizedPromptDataset(strategy, dataset)
    keep = ("input_ids", "attention_mask", "labels")
    return [{k: list(r[k]) for k in keep if k in r} for r in done]


def collator(tokenizer: Any) -> Any:
    """axolotl's collator for SFT rows (pads labels with -100), else transformers' of the same name."""
    try:
        from axolotl.utils.collators import DataCollatorForSeq2Seq
    except ImportError:  # a part of axolotl's stack not installed: transformers' collator pads the same way
        from transformers import DataCollatorForSeq2Seq
    return DataCollatorForSeq2Seq(tokenizer, padding=True, return_tensors="pt")


def data(run: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Any] | None:
    """(train rows, eval rows, collator) of an axolotl run: the local dataset's first rows, else synthetic rows in its
    format, tokenized and labelled by axolotl's own strategy with the twin's tokenizer. None, with a note on the run
    and the plan's axolotl part dropped, where the part of axolotl that type needs does not import here."""
    try:
        return _data(run)
    except ImportError as e:
        run.notes.append(f"axolotl's data path for dataset type {run.plan['axolotl']['dataset'].get('type')!r} does "
                         f"not import here ({type(e).__name__}: {e}): the labels are the rehearsal's own, not axolotl's")
        run.plan.pop("axolotl")
        return None


def _template_terminator(part: Mapping[str, Any], tokenizer: Any) -> str:
    """The turn terminator found in the chat template axolotl renders the rows with (the plan's guess first)."""
    try:
        from axolotl.utils.chat_templates import get_chat_template_from_config
        from axolotl.utils.dict import DictDefault

        template = get_chat_template_from_config(DictDefault(dict(part["cfg"])), dict(part["dataset"]), tokenizer)
    except (ImportError, ValueError):  # no template axolotl can name: the tokenizer's own
        template = getattr(tokenizer, "chat_template", None)
    template = template if isinstance(template, str) else ""
    return next((t for t in (part["terminator"], *_TERMINATORS.values(), "<end_of_turn>") if t in template),
                part["terminator"])


class Refused(ValueError):
    """axolotl's validation refused the config (its schema's message, as `axolotl train` would stop with it)."""


def validated(part: Mapping[str, Any]) -> tuple[Mapping[str, Any] | None, list[str]]:
    """(the config as axolotl's ``validate_config`` returns it, what axolotl warned while validating) — (None, []) where
    its validation does not import here. Raises ``Refused`` with axolotl's own messages where it refuses the config."""
    import copy
    import logging
    import warnings

    try:
        from axolotl.utils.config import validate_config
        from axolotl.utils.dict import DictDefault
    except ImportError:
        return None, []
    said: list[str] = []

    class Heard(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(" ".join(record.getMessage().split()))

    heard, logger = Heard(logging.WARNING), logging.getLogger("axolotl")
    logger.addHandler(heard)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            checked = validate_config(DictDefault(copy.deepcopy(dict(part.get("config") or {}))))
    except Exception as e:  # noqa: BLE001 - pydantic's ValidationError (a ValueError) and the validators' own
        errors = getattr(e, "errors", None)
        if type(e).__module__.split(".")[0] not in ("pydantic", "pydantic_core") or not callable(errors):
            raise
        # pydantic words a validator's ValueError "Value error, <its message>": the message is axolotl's.
        why = "; ".join(" ".join(str(err.get("msg", "")).removeprefix("Value error, ").split())
                        + (f" ({'.'.join(map(str, err['loc']))})" if err.get("loc") else "") for err in errors())
        raise Refused(f"axolotl {part.get('version')} refuses the config: {why}") from None
    finally:
        logger.removeHandler(heard)
    said += [" ".join(str(w.message).split()) for w in caught
             if issubclass(w.category, (DeprecationWarning, UserWarning, FutureWarning))]
    return checked, list(dict.fromkeys(m for m in said if m))


def _data(run: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Any]:
    from gemma_doctor.rehearse.rows import _read_rows

    part = run.plan["axolotl"]
    checked, said = validated(part)
    if checked is None:
        run.notes.append(f"axolotl {part['version']}'s config validation does not import here: the config was not "
                         "validated by axolotl")
    else:
        # The values axolotl's schema gives the keys its strategy reads (defaults included), as axolotl passes them.
        part["cfg"] = {**part["cfg"], **{k: checked[k] for k in _KEYS if checked.get(k) is not None}}
        run.notes += [f"axolotl {part['version']} warns while validating the config: {m}" for m in said]
    rows = _read_rows(Path(part["rows"]), 12) if part.get("rows") else []
    # The split the driver makes of the same rows (Run._rows): 8 + 4 of a local file, 6 + 2 synthetic.
    train, evaluation = (rows[:8], rows[8:] or rows[:2]) if rows else (_synthetic(part["dataset"])[:6],
                                                                      _synthetic(part["dataset"])[6:])
    # The terminator is the one of the template axolotl renders with; the plan's guess is the model type's.
    part["terminator"] = _template_terminator(part, run.tokenizer)
    part["eot_missing"] = eot_missing(part)
    overrides = cure(part) if part.get("cure") else None
    if overrides:
        part["cured_with"] = overrides["eot_tokens"]
    got = (tokenized(part, run.tokenizer, train, overrides), tokenized(part, run.tokenizer, evaluation, overrides),
           collator(run.tokenizer))
    run.notes.append(f"labels from axolotl {part['version']}'s `{part['dataset'].get('type')}` prompt strategy on "
                     f"{'the first rows of ' + Path(part['rows']).name if rows else 'synthetic rows in its format'}")
    return got
