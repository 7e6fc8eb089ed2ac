"""The thirteenth round's attacker pass: hostile inputs against what the round changed (issue 32's speed work).

- memo.py keys a served model by its facts' fields and a JSON file's parse by its text where the parse is a function
  of it (key_parts, _file_key). A cache of repos whose config texts hold the attacks on that key (the config's own
  name written with an escape beside the same name written plainly, a non-ASCII name beside its escaped twin, the
  neutral stand-ins themselves as names, another repo's id, folder and commit in a config, escapes in
  generation_config.json, safetensors metadata naming the repo) says the same bytes, text and JSON, with the scan's
  sharing on and off, and the sharing did share.
- rules/catalogue._never leaves out a run entry whose model clause fails for the model. Training configs that name a
  model type, a tokenizer, a template and the settings of every run entry, under stacks that open the entries'
  windows, give the same findings with _never forced off.
- plan/search.py and rules.Shared copy with frozen.replace, which skips __init__ for a class frozen._plain calls plain:
  no dataclass of gemma_doctor it calls plain has an __init__ of its own, a __new__ or a field behind a data
  descriptor, all of which frozen._plain does not look for and a copy without __init__ would skip (__post_init__ and
  init=False fields already take dataclasses.replace): a class that gains one fails here.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import pkgutil
from pathlib import Path

import pytest

from gemma_doctor import frozen, memo, pipeline
from gemma_doctor.facts import CheckOptions
from gemma_doctor.render.formats import CHECK, Checked, renderer
from gemma_doctor.report import FailOn
from gemma_doctor.rules import catalogue
from tests.builders import HubCache, dumps, gemma2_config, gemma3_1b_config, gemma3_12b_config, gemma3n_config
from tests.builders import generation_config
from tests.test_crashes import gemma4_config
from tests.test_memo_props import _views  # check's text and JSON of a whole cache, sharing on or off
from tests.test_pitfalls import tokenizer_config
from tests.test_safetensors import st_file

BASE = dumps(gemma3_1b_config())
TINY = dumps({**gemma3_1b_config(), "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16})


def _named(token: str, extra: str = "") -> bytes:
    """BASE with ``"_name_or_path": token`` (a raw JSON token, escapes as written) and ``extra`` raw pairs first."""
    return BASE.replace(b"{\n", ('{\n  "_name_or_path": ' + token + ",\n" + extra).encode(), 1)


def _weights(meta: dict[str, str] | None = None) -> bytes:
    return st_file({"model.embed_tokens.weight": ("BF16", [128, 32]),
                    "model.layers.0.self_attn.q_proj.weight": ("BF16", [32, 32])}, meta)


def _hostile_repos(commit_of_another: str) -> dict[str, dict[str, bytes]]:
    """Repo id -> files: pairs and triples of repos whose config texts are equal (the memo's gate) or equal but for
    their names, each pair an attack on the key."""
    out: dict[str, dict[str, bytes]] = {}
    for i in range(3):
        out[f"org/own{i}"] = {"config.json": _named(json.dumps(f"org/own{i}"))}  # each its own name
        out[f"org/oth{i}"] = {"config.json": _named(json.dumps("org/oth0"))}  # the first one's name in all three
        out[f"org/men{i}"] = {"config.json": _named('"x"', '  "base_model": "org/men0",\n'
                                                           '  "folder": "models--org--men1",\n')}
        out[f"org/wt{i}"] = {"config.json": TINY, "model.safetensors": _weights()}
    for i in range(2):
        # the name escaped where it is _name_or_path, plain in another key: the plain one is the only match of the
        # name's JSON, which _neutral_raw replaces
        out[f"org/en{i}"] = {"config.json": _named('"\\u006frg/en%d"' % i, '  "base_model": "org/en%d",\n' % i)}
        # a non-ASCII name written plainly, its escaped twin in another key
        out[f"org/un{i}"] = {"config.json": _named('"\u00fcn%d"' % i, '  "note": "\\u00fcn%d",\n' % i)}
        out[f"org/us{i}"] = {"config.json": _named('"\u00fcn"')}
        out[f"org/st{i}"] = {"config.json": _named(json.dumps("\u27e8name-or-path\u27e9"))}  # the stand-in, escaped
        out[f"org/sr{i}"] = {"config.json": _named('"\u27e8name-or-path\u27e9"')}  # the stand-in as it is
        out[f"org/mk{i}"] = {"config.json": _named('"\u27e8model-id\u27e9"')}  # a place for a name
        out[f"org/rm{i}"] = {"config.json": _named('"\u27e8repo\u27e9"')}
        out[f"org/tw{i}"] = {"config.json": _named(json.dumps(f"org/tw{i}"), '  "base_model": "org/tw%d",\n' % i)}
        out[f"org/ns{i}"] = {"config.json": _named('[1, "org/ns%d"]' % i)}
        out[f"org/cm{i}"] = {"config.json": _named(json.dumps(commit_of_another))}
        out[f"org/gx{i}"] = {"config.json": BASE,
                             "generation_config.json": b'{"use_c\\u0061che": false, "bos_token_id": 2}'}
        out[f"org/gd{i}"] = {"config.json": BASE, "generation_config.json": b'{"use_cache": tru' if i else b"{}"}
        out[f"org/ge{i}"] = {"config.json": BASE, "tokenizer_config.json": dumps(tokenizer_config()),
                             "generation_config.json": b'{"eos_token_id": [1, 106]}' if i else b'{"eos_token_id": 1}'}
        out[f"org/td{i}"] = {"config.json": BASE,
                             "tokenizer_config.json": dumps(tokenizer_config(pad_token="<eos>" if i else "<pad>"))}
        out[f"org/nm{i}"] = {"config.json": BASE.replace(b'"num_key_value_heads": 1', b'"num_key_value_heads": 1.0')
                             if i else BASE}
        out[f"org/wm{i}"] = {"config.json": TINY,
                             "model.safetensors": _weights({"format": "pt", "source": f"org/wm{i}"})}
        out[f"org/wf{i}"] = {"config.json": TINY,
                             "model.safetensors": _weights({"format": "pt", "source": f"models--org--wf{i}"})}
    # one neutral text, two parses: the name escaped, the plain twin made the stand-in by _neutral_raw in the first,
    # written as the stand-in's escape in the second (their keys must hold the parse, not the text alone)
    out["org/qa"] = {"config.json": _named('"\\u006frg/q"', '  "base_model": "org/q",\n')}
    stand_in = json.dumps("\u27e8name-or-path\u27e9")
    out["org/qb"] = {"config.json": _named('"\\u006frg/q"', '  "base_model": %s,\n' % stand_in)}
    return out


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    hub = HubCache(tmp_path_factory.mktemp("hostile13") / "hub")
    first = hub.add("org/first", {"config.json": BASE})
    for repo, files in _hostile_repos(first.name).items():
        hub.add(repo, files)
    return hub.root


@pytest.mark.parametrize("gpu", [None, "T4"])
def test_hostile_names_and_escapes_give_the_same_bytes_with_the_memo_on_and_off(hostile, monkeypatch, gpu) -> None:
    monkeypatch.setenv("GEMMA_DOCTOR_WORKERS", "1")  # one process: the memo's counts are this process's
    monkeypatch.delenv("GEMMA_DOCTOR_NO_MEMO", raising=False)
    made: list[memo.Memo] = []
    init = memo.Memo.__init__

    def counting(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(memo.Memo, "__init__", counting)
    opts = CheckOptions(fail_on=FailOn.NEVER, gpu=gpu)
    shared, direct = _views(hostile, opts, True), _views(hostile, opts, False)
    assert shared[0] == direct[0]
    assert shared[1] == direct[1]
    on = [m for m in made if m.on]
    # the attack reached the key: judgements made name-free and served to other repos
    counts = [(m.judgements, m.served) for m in on]
    assert sum(j for j, _ in counts) >= 10 and sum(s for _, s in counts) >= 3, counts


TRAINING = {
    "trl.yaml": "model_name_or_path: google/gemma-3-12b-it\nbf16: true\nassistant_only_loss: true\n"
                "per_device_train_batch_size: 4\ngradient_accumulation_steps: 4\nuse_liger_kernel: true\n"
                "padding_free: true\npacking: false\nmax_length: 1024\nuse_peft: true\n"
                "lora_target_modules: [language_model.model.layers.0.q_proj]\ndataset_text_field: text\n",
    # axolotl's own model_type and tokenizer settings: not the model's (the clauses _never reads)
    "axolotl.yaml": "base_model: google/gemma-3-1b-it\nmodel_type: Gemma3ForConditionalGeneration\n"
                    "tokenizer_type: AutoTokenizer\ntokenizer_config: ./other\nadapter: lora\nmicro_batch_size: 2\n"
                    "gradient_accumulation_steps: 2\nload_in_8bit: true\n"
                    "plugins: [axolotl.integrations.liger.LigerPlugin]\nliger_rms_norm: true\nchat_template: gemma3\n"
                    "datasets:\n  - path: x\n    type: chat_template\nbf16: true\n",
    "llamafactory.yaml": "model_name_or_path: google/gemma-2-9b\nstage: dpo\ndo_train: true\nfinetuning_type: lora\n"
                         "template: gemma3\nenable_liger_kernel: true\nper_device_train_batch_size: 2\nfp16: true\n",
    "grpo.yaml": "model_name_or_path: google/gemma-4-E2B-it\nfp16: true\nper_device_train_batch_size: 8\n"
                 "attn_implementation: sdpa\n",
}
STACKS = [(), ("transformers==4.50.3", "trl==0.19.0", "liger-kernel==0.5.0", "llamafactory==0.9.2",
               "unsloth-zoo==2025.1.1", "peft==0.12.0"), ("transformers==5.5.1", "trl==1.0.0")]


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("never13")
    hub = HubCache(root / "hub")
    # a template without a generation block and no BOS: the tokenizer clauses of GD701-GD704 hold
    tok = tokenizer_config(chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}", add_bos_token=False)
    for repo, cfg in [("g/g2", gemma2_config()), ("g/g3", gemma3_12b_config()), ("g/g3t", gemma3_1b_config()),
                      ("g/g3n", gemma3n_config()), ("g/g4", gemma4_config(kv_shared=20)), ("g/g4b", gemma4_config())]:
        hub.add(repo, {"config.json": cfg, "generation_config.json": generation_config(), "tokenizer_config.json": tok})
    for name, text in TRAINING.items():
        (root / name).write_text(text)
    return hub.root, root


@pytest.mark.parametrize("stack", STACKS, ids=["installed", "old windows", "new windows"])
@pytest.mark.parametrize("training", sorted(TRAINING))
def test_a_run_cannot_reopen_an_entry_never_left_out(families, monkeypatch, training, stack) -> None:
    cache, root = families
    targets = ["g/g2", "g/g3", "g/g3t", "g/g3n", "g/g4", "g/g4b"]
    never = catalogue._never
    left_out = [0]

    def counting(when, model, env):  # noqa: ANN001, ANN202
        out = never(when, model, env)
        left_out[0] += out
        return out

    outs = []
    for rule in (counting, lambda when, model, env: False):
        monkeypatch.setattr(catalogue, "_never", rule)
        for gpu, task in ((None, None), ("T4", None), ("A100", "grpo")):
            opts = CheckOptions(fail_on=FailOn.NEVER, gpu=gpu, task=task, with_packages=stack,
                                training_config=str(root / training))
            view = renderer(CHECK, "json")
            report = pipeline.diagnose(targets, cache, options=opts, finish=view.streaming(False))
            outs.append(view.render(Checked(report, opts.fail_on), False))
    assert left_out[0] > 0
    assert outs[:3] == outs[3:]


def _dataclasses_of_gemma_doctor() -> list[type]:
    import gemma_doctor

    found = []
    for info in pkgutil.walk_packages(gemma_doctor.__path__, "gemma_doctor."):
        if ".rehearse.hook" in info.name:  # the rehearsal's child side: imported inside a training process only
            continue
        module = importlib.import_module(info.name)
        found += [c for c in vars(module).values()
                  if inspect.isclass(c) and dataclasses.is_dataclass(c) and c.__module__ == module.__name__]
    return found


def test_frozen_replace_skips_no_init_a_copied_class_has() -> None:
    """Every dataclass of gemma_doctor frozen.replace copies without __init__ has the __init__ @dataclass wrote, no
    __new__ and no field behind a descriptor: its copies are dataclasses.replace's."""
    plain = [c for c in _dataclasses_of_gemma_doctor() if frozen._plain(c) is not None]
    assert len(plain) > 20  # the facts, the run, the environment, the options, the plans...
    for cls in plain:
        code = getattr(cls.__init__, "__code__", None)
        assert code is not None and code.co_filename.startswith("<"), f"{cls.__qualname__} has its own __init__"
        assert cls.__new__ is object.__new__, cls
        for f in dataclasses.fields(cls):
            held = next((vars(k)[f.name] for k in cls.__mro__ if f.name in vars(k)), None)
            assert not hasattr(type(held), "__set__"), f"{cls.__qualname__}.{f.name}: a descriptor"
