"""Write gemma_doctor/readers/llamafactory_keys.json: the settings LLaMA-Factory's training config accepts (every
field of the five argument classes `llamafactory-cli train` parses a YAML into: hparams/parser.py _TRAIN_ARGS, its
ModelArguments, DataArguments, TrainingArguments, FinetuningArguments and GeneratingArguments), which of them are
booleans, and the release they were read from. LLaMA-Factory parses the file with allow_extra_keys=False (unless
ALLOW_EXTRA_ARGS is set), so a misspelt key stops the run: GD680 names it. LLaMA-Factory is imported from a folder of
its own beside its stack's venv (tests/venvs.py ensure_llamafactory).
Usage: PYTHONPATH=<the folder with llamafactory==0.9.5> <its stack's python> docs/gen_llamafactory_keys.py [--check]"""

from __future__ import annotations

import json
from pathlib import Path

from gen_trainer_keys import fields_of, write_or_check  # docs/: the same field walk and --check as TRL's table

OUT = Path(__file__).resolve().parent.parent / "gemma_doctor" / "readers" / "llamafactory_keys.json"


def render() -> str:
    """The table as the importable LLaMA-Factory defines it."""
    import llamafactory
    from llamafactory.hparams import parser

    keys, booleans = fields_of(parser._TRAIN_ARGS)
    table = {"read_from": {"llamafactory": llamafactory.__version__},
             "arguments": [cls.__name__ for cls in parser._TRAIN_ARGS], "keys": sorted(keys), "booleans": sorted(booleans)}
    return json.dumps(table, indent=1) + "\n"


if __name__ == "__main__":
    write_or_check(OUT, render(), "gen_llamafactory_keys.py")
