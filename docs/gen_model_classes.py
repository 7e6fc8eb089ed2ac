"""Write gemma_doctor/readers/model_classes.json: for every Gemma-family model_type, the torch module classes its
transformers modeling code defines (and those of its sub-configs: the SigLIP tower of Gemma 3 / PaliGemma, Gemma 3n's
timm tower), with the transformers version they were read from. An FSDP wrap class is looked up in it: accelerate stops
on a class the model lacks. tests/test_distributed_classes.py compares it with the installed transformers.
Usage: python docs/gen_model_classes.py [--check]"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "gemma_doctor" / "readers" / "model_classes.json"


# Sub-configs declared as AutoConfig (any text model): the text models the family's checkpoints use (PaliGemma 1:
# Gemma, PaliGemma 2: Gemma 2; facts.md section 2).
AUTO_TEXT = {"paligemma": ("gemma", "gemma2")}


def _module_classes(config_class: type) -> set[str]:
    """nn.Module classes defined by the modeling module next to ``config_class``'s configuration module."""
    import torch

    name = config_class.__module__.replace(".configuration_", ".modeling_")
    try:
        mod = importlib.import_module(name)
    except ImportError:
        return set()
    return {n for n, c in vars(mod).items() if inspect.isclass(c) and issubclass(c, torch.nn.Module)
            and c.__module__ == mod.__name__}


def render() -> str:
    """The table as the installed transformers defines it."""
    import transformers
    from transformers import CONFIG_MAPPING

    from gemma_doctor.family import MEMBERS

    table: dict[str, list[str]] = {}
    for m in MEMBERS:
        if m.model_type not in CONFIG_MAPPING:
            continue
        seen: set[type] = set()
        todo = [CONFIG_MAPPING[t] for t in (m.model_type, *AUTO_TEXT.get(m.model_type, ()))]
        classes: set[str] = set()
        while todo:
            cfg = todo.pop()
            if cfg in seen:
                continue
            seen.add(cfg)
            classes |= _module_classes(cfg)
            try:  # an AutoConfig sub-config is known by the default config's instance (Gemma 3's SigLIP tower)
                default = cfg()
            except Exception:  # noqa: BLE001 - a config that needs arguments: its declared sub-configs only
                default = None
            for key, sub in (getattr(cfg, "sub_configs", None) or {}).items():
                got = type(getattr(default, key, None)) if default is not None else sub
                if isinstance(got, type) and got.__module__.startswith("transformers.models.") and \
                        ".auto." not in got.__module__:
                    todo.append(got)
        if classes:
            table[m.model_type] = sorted(classes)
    return json.dumps({"read_from": {"transformers": transformers.__version__}, "classes": table}, indent=1) + "\n"


if __name__ == "__main__":
    text = render()
    if "--check" in sys.argv:
        sys.exit(0 if OUT.read_text() == text else f"out of date: {OUT.name} (run python docs/gen_model_classes.py)")
    OUT.write_text(text)
