"""Write gemma_doctor/readers/trainer_keys.json: the settings TRL's command-line trainers accept in a config file (every
field of the dataclasses each `trl <command>` parses: ScriptArguments, ModelConfig, DatasetMixtureConfig and the
trainer's config, itself a transformers TrainingArguments), which of them are booleans, and the versions they were read
from. tests/test_training_keys.py compares it with the installed TRL. Usage: python docs/gen_trainer_keys.py [--check]"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import typing
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "gemma_doctor" / "readers" / "trainer_keys.json"
# The `trl` commands whose parsers read a --config file (trl/scripts/*.py make_parser).
COMMANDS = ("sft", "dpo", "grpo", "kto", "reward", "rloo")


def _is_bool(tp: typing.Any) -> bool:
    """bool, or Optional[bool] (TrainingArguments' tri-state switches)."""
    if tp is bool:
        return True
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return typing.get_origin(tp) in (typing.Union, getattr(__import__("types"), "UnionType", typing.Union)) \
        and args == [bool]


def fields_of(classes: typing.Iterable[type]) -> tuple[set[str], set[str]]:
    """The settings a parser of these dataclasses accepts (their init fields) and which of them are booleans."""
    keys: set[str] = set()
    booleans: set[str] = set()
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.init:
                keys.add(f.name)
                if _is_bool(hints.get(f.name)):
                    booleans.add(f.name)
    return keys, booleans


def render() -> str:
    """The table as the installed TRL and transformers define it."""
    import transformers
    import trl

    classes = [cls for command in COMMANDS
               for cls in importlib.import_module(f"trl.scripts.{command}").make_parser().dataclass_types]
    keys, booleans = fields_of(classes)
    table = {"read_from": {"trl": trl.__version__, "transformers": transformers.__version__},
             "commands": list(COMMANDS), "keys": sorted(keys), "booleans": sorted(booleans)}
    return json.dumps(table, indent=1) + "\n"


def write_or_check(out: Path, text: str, script: str) -> None:
    """Write ``text`` to ``out``, or with --check exit 1 where the file differs from it (docs/gen_*_keys.py)."""
    if "--check" in sys.argv:
        sys.exit(0 if out.read_text() == text else f"out of date: {out.name} (run python docs/{script})")
    out.write_text(text)


if __name__ == "__main__":
    write_or_check(OUT, render(), "gen_trainer_keys.py")
