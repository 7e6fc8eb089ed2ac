"""Every cure that names a version names one outside the window its finding states: the catalogue's cures against
their own windows, every Window's first fixed release against its range, and each rule's `pip install "pkg>=V"`
followed (the same check with `--with pkg==V`) no longer gives that finding."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re

import pytest

from gemma_doctor.stack import Window, normalise
from tests.builders import EXAMPLES, gemma2_config, gemma3_1b_config, gemma3_12b_config, generation_config, variant

# A pin as a cure writes it: `pkg>=V`, `pkg==V`, `pkg~=V` (prose such as "on transformers >= 4.52" is not one).
PIN = re.compile(r"(?<![\w.-])([A-Za-z][A-Za-z0-9_.-]*?)(>=|==|~=)(\d+(?:\.\d+)*(?:\.post\d+|rc\d+|\.dev\d+)?)")
# `--with pkg==V` in a printed command names the stack the hint plans for, not a cure.
WITH = re.compile(r"--with\s+\S+")


def pins(text: str) -> list[tuple[str, str, str]]:
    """(package, operator, version) of every pin in ``text``."""
    return [(normalise(p), op, v) for p, op, v in PIN.findall(WITH.sub("", text or ""))]


def test_pins_are_read_as_cures_write_them():
    assert pins('pip install "flash-attn>=2.6.2", or attn_implementation="eager"') == [("flash-attn", ">=", "2.6.2")]
    assert pins("transformers==4.50.3 and peft~=0.18.0") == [("transformers", "==", "4.50.3"), ("peft", "~=", "0.18.0")]
    assert pins("gemma-doctor fix m --with transformers==4.50.3 --inplace; on transformers >= 4.52") == []


def _windows() -> list[tuple[str, Window]]:
    import gemma_doctor.rules as rules

    names = ["gemma_doctor.versioning"] + [f"gemma_doctor.rules.{m.name}" for m in pkgutil.iter_modules(rules.__path__)]
    return [(f"{n}.{k}", v) for n in names for k, v in vars(importlib.import_module(n)).items() if isinstance(v, Window)]


def test_every_window_s_first_fixed_release_lies_outside_it():
    found = _windows()
    assert len(found) > 20
    assert [(name, w) for name, w in found if w.first_fixed and w.contains(w.first_fixed)] == []


def test_every_catalogue_cure_pins_a_version_outside_its_window():
    from gemma_doctor import catalogue

    bad = [(e["code"], pkg, op, v, e["windows"][pkg]) for e in catalogue.coded() for pkg, op, v in pins(e["cure"])
           if pkg in {normalise(p) for p in e.get("windows") or {}}
           for spec in [{normalise(p): s for p, s in e["windows"].items()}[pkg]] if Window(pkg, spec).contains(v)]
    assert bad == []


_G3_TRAIN = {"bf16": True, "gradient_checkpointing": True, "use_peft": True, "lora_target_modules": ["embed_tokens", "q_proj"],
             "attn_implementation": "flash_attention_2", "packing": True, "per_device_train_batch_size": 1,
             "max_length": 1024, "fsdp": "full_shard auto_wrap", "assistant_only_loss": True}
# (files, training config, --with pins of an old stack, --gpu): scenarios whose findings pin versions in their cures.
SCENARIOS = [
    ({"config.json": gemma3_12b_config(), "generation_config.json": generation_config()}, _G3_TRAIN,
     ("transformers==4.50.3", "peft==0.11.0", "trl==0.19.0", "flash-attn==2.5.4", "accelerate==1.5.2"), "A10G"),
    ({"config.json": variant(gemma2_config(), head_dim=256)}, {"bf16": True, "attn_implementation": "flash_attention_2",
                                                                "use_peft": True, "packing": True},
     ("transformers==4.45.2", "flash-attn==2.6.1", "peft==0.12.0", "trl==0.12.0"), "A100"),
    ({"config.json": (EXAMPLES / "google--gemma-4-E2B-it" / "config.json").read_bytes()},
     {"bf16": True, "gradient_checkpointing": True, "use_cache": False, "lora_target_modules": "all-linear",
      "zero_stage": 3, "fsdp": "full_shard auto_wrap"},
     ("transformers==5.5.0", "peft==0.17.1", "accelerate==1.14.0"), "H100"),
    ({"config.json": variant(gemma3_1b_config(), use_bidirectional_attention=True, sliding_window=512)},
     {"bf16": True}, ("transformers==4.56.2",), "L4"),
]


def _findings(cli, hub, tmp_path, files, training, withs, gpu) -> list[dict]:
    path = tmp_path / "train.json"
    path.write_text(json.dumps(training))
    args = ["check", "acme/model", "--cache-dir", hub.root, "--format", "json", "--fail-on", "never", "--gpu", gpu,
            "--training-config", path]
    for w in withs:
        args += ["--with", w]
    r = cli(*args)
    assert r.code == 0, r
    return r.json()["models"][0]["findings"]


@pytest.mark.parametrize("files, training, withs, gpu", SCENARIOS, ids=["gemma3-old", "gemma2", "gemma4-5.5", "embedding"])
def test_a_rule_s_pinned_cure_followed_no_longer_gives_its_finding(cli, hub, tmp_path, files, training, withs, gpu):
    hub.add("acme/model", files)
    before = _findings(cli, hub, tmp_path, files, training, withs, gpu)
    cured = [(f["code"], p) for f in before if f["severity"] != "info" and not f["code"].startswith("GD7")
             for p in pins(f["fix"])[:1] if p[1] != "~="]
    assert cured, "the scenario must exercise some pinned cures"
    stack = {normalise(w.split("==")[0]): w for w in withs}
    still = []
    for code, (pkg, _op, version) in cured:
        after = _findings(cli, hub, tmp_path, files, training, tuple({**stack, pkg: f"{pkg}=={version}"}.values()), gpu)
        if any(f["code"] == code for f in after):
            still.append((code, f"{pkg}=={version}"))
    assert still == [], cured
