"""Write gemma_doctor/readers/axolotl_keys.json: the top-level keys axolotl's config schema accepts (every field of
AxolotlInputConfig, axolotl/utils/schemas/config.py, and their aliases), which of them are booleans (and which are a
literal word or a boolean: bf16's "auto"), and the release they were read from. axolotl's schema ignores a key it has no field for (pydantic's default, extra="ignore"), so a
misspelt key trains with the field's default without a word: GD986 names it. axolotl is imported from a folder of
its own (its install pins a stack of its own; tests/venvs.py ensure_packages).
Usage: PYTHONPATH=<a folder with axolotl==0.19.0 colorama addict pillow> python docs/gen_axolotl_keys.py [--check]"""

from __future__ import annotations

import json
from pathlib import Path

import typing

from gen_trainer_keys import _is_bool, write_or_check  # docs/: the same boolean test and --check as TRL's table

OUT = Path(__file__).resolve().parent.parent / "gemma_doctor" / "readers" / "axolotl_keys.json"


def _literal_or_bool(tp: typing.Any) -> list[str]:
    """The literal words of a `Literal[...] | bool | None` field (bf16: "auto"; gradient_checkpointing: "offload"), which
    pydantic accepts beside its booleans; [] for any other type."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    literal = [a for a in args if typing.get_origin(a) is typing.Literal]
    if bool not in args or len(literal) != 1 or len(args) != 2:
        return []
    return sorted(str(w) for w in typing.get_args(literal[0]))


def render() -> str:
    """The table as the importable axolotl defines it."""
    import axolotl
    from axolotl.utils.schemas.config import AxolotlInputConfig

    keys: set[str] = set()
    booleans: set[str] = set()
    literals: dict[str, list[str]] = {}
    for name, field in AxolotlInputConfig.model_fields.items():
        words = _literal_or_bool(field.annotation)
        for key in (name, field.alias):
            if key:
                keys.add(key)
                if _is_bool(field.annotation):
                    booleans.add(key)
                elif words:
                    literals[key] = words
    table = {"read_from": {"axolotl": axolotl.__version__},
             "schema": "axolotl/utils/schemas/config.py AxolotlInputConfig (fields and aliases)",
             "keys": sorted(keys), "booleans": sorted(booleans), "literal_booleans": dict(sorted(literals.items()))}
    return json.dumps(table, indent=1) + "\n"


if __name__ == "__main__":
    write_or_check(OUT, render(), "gen_axolotl_keys.py")
