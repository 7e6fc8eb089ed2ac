"""`rehearse TARGET --launch "llamafactory-cli train cfg.yaml"`: LLaMA-Factory's own train on the twin.

The user's YAML is copied into the rehearsal's folder with only what the rehearsal must own replaced (the step
budget, the output folder, the dataset's rows, what this machine cannot run), each replacement a note; then
`llamafactory-cli train COPY` runs as a launched command (gemma_doctor/rehearse/launch.py): the twin in a private
offline hub cache under the repo id the YAML's `model_name_or_path` names, the Trainer probe armed in its process, so
the stages are judged by the rehearsal's usual invariants. Imports nothing heavy.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from gemma_doctor.errors import UsageError
from gemma_doctor.report import Finding, Severity

COMMANDS = ("llamafactory-cli", "lmf")  # the console scripts LLaMA-Factory installs (`lmf` is its shortcut)
ROWS = 8  # rows of data the rehearsal trains on: a few steps of a small batch
# Keys whose part needs what a CPU rehearsal has not (a GPU kernel, a second process, a package LLaMA-Factory's train
# does not need): dropped from the copy, each with why.
_DROPPED = {
    "quantization_bit": "bitsandbytes / GPTQ quantization needs a GPU: rehearsed unquantized",
    "quantization_method": "quantization needs a GPU: rehearsed unquantized",
    "double_quantization": "quantization needs a GPU: rehearsed unquantized",
    "deepspeed": "DeepSpeed's engine needs an accelerator: rehearsed on one process",
    "use_unsloth": "Unsloth's kernels need a GPU: rehearsed with plain transformers",
    "use_unsloth_gc": "Unsloth's kernels need a GPU: rehearsed with plain transformers",
    "enable_liger_kernel": "Liger Kernel's Triton kernels need a GPU: rehearsed without them",
    "preprocessing_num_workers": "worker processes for tokenizing a few rows: tokenized in the process",
    "resume_from_checkpoint": "the rehearsal starts from the twin",
    "plot_loss": "the loss plot (matplotlib) is an output, not the training",
    "push_to_hub": "nothing leaves the machine",
    "hub_model_id": "nothing leaves the machine",
    "streaming": "the rows are a local file",
    "tokenized_path": "the rows are tokenized afresh from the rehearsal's data",
}
# dataset_info.json keys of rows that are not a local file (LLaMA-Factory's data/parser.py reads them before file_name)
_REMOTE = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")
_GPU_OPTIMIZERS = ("8bit", "paged", "bnb")
_FLASH = ("fa2", "fa3", "flash_attention_2", "flash_attention_3")


def config_of(launch: str) -> tuple[Path, list[str]] | None:
    """(the YAML, the `key=value` overrides after it) of a `llamafactory-cli train FILE` line; None for another line."""
    try:
        words = shlex.split(launch, comments=True)
    except ValueError as e:
        raise UsageError(f"--launch is not a command line: {e}") from None
    at = next((i for i, w in enumerate(words) if Path(w).name in COMMANDS), None)
    if at is None:
        return None
    rest = words[at + 1:]
    if rest[:1] != ["train"]:
        raise UsageError(f"--launch: `{Path(words[at]).name} {' '.join(rest[:1])}` is not a training run; rehearse "
                         "`llamafactory-cli train FILE`")
    if len(rest) < 2 or not rest[1].endswith((".yaml", ".yml", ".json")):
        raise UsageError("--launch: `llamafactory-cli train` without a YAML or JSON config; name the config the run "
                         "reads")
    return Path(rest[1]), rest[2:]


def command() -> list[str] | None:
    """How to start LLaMA-Factory's CLI in this environment: the console script beside this interpreter, else its
    module; None where LLaMA-Factory is not installed (nothing is installed for the run)."""
    beside = Path(sys.executable).parent / "llamafactory-cli"
    if beside.is_file():
        return [str(beside)]
    if importlib.util.find_spec("llamafactory") is not None:
        return [sys.executable, "-m", "llamafactory.cli"]
    return None


def not_installed() -> Finding:
    """GD950 for a `llamafactory-cli train` line where LLaMA-Factory is not installed: named, nothing rehearsed."""
    return Finding("GD950", Severity.ERROR, f"not rehearsable: LLaMA-Factory is not installed in this environment "
                   f"({sys.executable})", key="stack",
                   fix="run the rehearsal in the environment that trains (nothing is installed for you)")


def _read(path: Path) -> dict[str, Any]:
    """The user's config as a mapping, or a one-line UsageError."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--launch: the config {path} cannot be read ({getattr(e, 'strerror', None) or e})") from None
    except (ValueError, yaml.YAMLError) as e:
        raise UsageError(f"--launch: the config {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                         f"{str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UsageError(f"--launch: the config {path} is not a mapping of LLaMA-Factory's keys")
    return data


def _names(value: Any) -> list[str]:
    """LLaMA-Factory's dataset list: a comma-separated string or a list."""
    if isinstance(value, str):
        return [n.strip() for n in value.split(",") if n.strip()]
    if isinstance(value, list):
        return [str(n).strip() for n in value if str(n).strip()]
    return []


def _exists(path: Path) -> bool:
    """Whether ``path`` exists; a name no file system can hold (a NUL, too long) names nothing."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _shape(entry: dict[str, Any]) -> dict[str, Any]:
    """The format of a dataset_info.json entry (formatting, ranking, column and tag names), what is not a name
    dropped, so that the synthetic rows and the copy's entry agree."""
    shape: dict[str, Any] = {}
    if entry.get("formatting") in ("alpaca", "sharegpt"):
        shape["formatting"] = entry["formatting"]
    for key in ("columns", "tags"):
        names = entry.get(key)
        if isinstance(names, dict) and any(isinstance(v, str) for v in names.values()):
            shape[key] = {str(k): v for k, v in names.items() if isinstance(v, str)}
    if entry.get("ranking") is True:
        shape["ranking"] = True
    return shape


def _synthetic(entry: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """``n`` rows in the format a dataset_info.json entry names (alpaca columns, or sharegpt messages with its tags)."""
    columns = entry.get("columns") or {}
    ranking = bool(entry.get("ranking"))
    rows = []
    for i in range(n):
        question = f"Question {i}: what is {i} plus {i + 1}? " + "Explain briefly. " * (i % 3)
        answer = f"{i} plus {i + 1} is {2 * i + 1}." + " That is the sum." * (i % 2)
        if entry.get("formatting") == "sharegpt":
            tags = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
                    **(entry.get("tags") or {})}
            turn = lambda role, text: {tags["role_tag"]: tags[role], tags["content_tag"]: text}  # noqa: E731
            messages = [turn("user_tag", question)]
            if not ranking:
                messages.append(turn("assistant_tag", answer))
            row = {columns.get("messages", "conversations"): messages}
            if ranking:
                row[columns.get("chosen", "chosen")] = turn("assistant_tag", answer)
                row[columns.get("rejected", "rejected")] = turn("assistant_tag", "I do not know.")
        else:
            row = {columns.get("prompt", "instruction"): question, columns.get("query", "input"): ""}
            if ranking:
                row[columns.get("chosen", "chosen")] = answer
                row[columns.get("rejected", "rejected")] = "I do not know."
            else:
                row[columns.get("response", "output")] = answer
        rows.append(row)
    return rows


# The stages that train on pairs (LLaMA-Factory's loader refuses other rows there: "The dataset is not applicable in
# the current training stage"): a dataset the rehearsal cannot see gets ranking rows for them.
_PAIRWISE = ("rm", "dpo")


def _datasets(data: dict[str, Any], config_dir: Path, cwd: Path, out: Path, notes: list[str]) -> None:
    """Point the copy's datasets at rows the rehearsal can read: a local file's first rows (``max_samples``), else
    synthetic rows in the format the user's dataset_info.json names (pairs for a pairwise stage where no entry names
    it); the copy's own dataset_info.json in ``out``."""
    named = str(data.get("dataset_dir") or "data")
    where = next((d for d in (cwd / named, config_dir / named) if _exists(d / "dataset_info.json")), None)
    info: dict[str, Any] = {}
    if where is not None:
        try:
            loaded = json.loads((where / "dataset_info.json").read_text(encoding="utf-8"))
            info = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError) as e:
            notes.append(f"{where / 'dataset_info.json'} cannot be read ({e}): synthetic rows used")
    mine: dict[str, Any] = {}
    local = False
    for key in ("dataset", "eval_dataset"):
        names = _names(data.get(key))
        for name in names:
            if name in mine:
                continue
            entry = info.get(name) if isinstance(info.get(name), dict) else None
            file = entry.get("file_name") if entry else None
            if entry and isinstance(file, str) and not any(k in entry for k in _REMOTE) \
                    and where is not None and _exists(where / file):
                mine[name] = {**entry, "file_name": str((where / file).resolve())}
                local = True
                notes.append(f"dataset {name}: its first rows ({where / file}, max_samples {ROWS})")
                continue
            shape = _shape(entry or {})
            if entry is None and str(data.get("stage") or "sft") in _PAIRWISE:
                # an unseen dataset (LLaMA-Factory's own demo entries live in its repo's data/ folder) of a stage that
                # trains on pairs: ranking rows, as the run's own dataset must be
                shape["ranking"] = True
            if shape.get("ranking"):
                # LLaMA-Factory reads a pair's columns only where the entry names them (its DatasetAttr has no default
                # for chosen / rejected: KeyError None): the synthetic rows' entry names the ones they hold
                shape["columns"] = {"chosen": "chosen", "rejected": "rejected", **shape.get("columns", {})}
            rows_file = out / f"rehearsal-{len(mine)}.json"
            rows_file.write_text(json.dumps(_synthetic(shape, ROWS)), encoding="utf-8")
            mine[name] = {**shape, "file_name": str(rows_file)}
            why = ("not in any dataset_info.json found" if entry is None else
                   "a hub dataset" if any(k in entry for k in _REMOTE) else "not a local file")
            notes.append(f"dataset {name} ({why}): {ROWS} synthetic rows in its format "
                         f"({shape.get('formatting', 'alpaca')}{', ranking' if shape.get('ranking') else ''})")
    if not mine:
        return
    (out / "dataset_info.json").write_text(json.dumps(mine, indent=1), encoding="utf-8")
    data["dataset_dir"] = str(out)
    if local or not (isinstance(data.get("max_samples"), int) and 0 < data["max_samples"] <= ROWS):
        data["max_samples"] = ROWS


def prepare(config: Path, overrides: list[str], folder: Path, steps: int, repo_id: str | None,
            cwd: Path) -> tuple[list[str], list[str]]:
    """(the command that runs LLaMA-Factory's train on the rehearsal's copy of ``config``, notes on what the copy
    replaced). The copy and its data are written in ``folder``, which must outlive the run."""
    cli = command()
    if cli is None:
        raise UsageError(f"--launch: LLaMA-Factory is not installed in this environment ({sys.executable})")
    copy, notes = copy_config(config, folder, steps, repo_id, cwd)
    return [*cli, "train", str(copy), *overrides], notes


def copy_config(config: Path, folder: Path, steps: int, repo_id: str | None, cwd: Path) -> tuple[Path, list[str]]:
    """(the rehearsal's copy of the user's LLaMA-Factory config, written in ``folder``, notes on what it replaced)."""
    path = (cwd / config).absolute()
    if not _exists(path) or not path.is_file():
        raise UsageError(f"--launch: the config {config} is not a file (looked in {cwd})")
    data = _read(path)
    notes: list[str] = []
    stage = str(data.get("stage") or "sft")
    if stage not in ("sft", "pt"):
        notes.append(f"stage {stage}: LLaMA-Factory's {stage} loop runs as written; the rehearsal's labels and "
                     "loss invariants are those of a language-modelling run")
    named = data.get("model_name_or_path")
    if repo_id and named != repo_id:
        notes.append(f"model_name_or_path {named!r}: the twin's repo id {repo_id} instead")
        data["model_name_or_path"] = repo_id
    for key, why in _DROPPED.items():
        if key not in data or data[key] in (None, False, "", 0):
            continue
        notes.append(f"{key}: {data[key]!r} dropped ({why})")
        del data[key]
    optim = str(data.get("optim") or "")
    if any(word in optim for word in _GPU_OPTIMIZERS):
        notes.append(f"optim: {optim!r} needs bitsandbytes on a GPU: AdamW instead")
        data["optim"] = "adamw_torch"
    if str(data.get("flash_attn") or "").lower() in _FLASH:
        notes.append(f"flash_attn: {data['flash_attn']!r} needs flash-attention on a GPU: sdpa instead")
        data["flash_attn"] = "sdpa"
    out = folder / "llamafactory"
    out.mkdir(parents=True, exist_ok=True)
    _datasets(data, path.parent, cwd, out, notes)
    data["max_steps"] = steps
    data["output_dir"] = "llamafactory-output"  # relative: under the rehearsal's working folder
    data["overwrite_output_dir"] = True
    data["report_to"] = "none"
    notes.append(f"LLaMA-Factory config {config}: max_steps {steps}, output_dir in the rehearsal's folder, no "
                 "reporting")
    copy = out / ("rehearsal" + (".json" if path.suffix == ".json" else ".yaml"))
    import yaml

    copy.write_text(json.dumps(data) if path.suffix == ".json" else yaml.safe_dump(data, sort_keys=False),
                    encoding="utf-8")
    return copy, notes
