"""The field catalogue (gemma_doctor/catalogue/field.json) holds to its schema, documents every code, and each entry's
condition raises its finding on its own positive example and not on its negative one, through the real `check`.

The reproductions of the entries triaged "reproduced" run here too, with the installed (test-stack) transformers and
TRL on CPU: no extra venv is needed for them.
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from gemma_doctor import catalogue
from gemma_doctor.codes import CODES
from gemma_doctor.rules.catalogue import _MISSING, match

ROOT = Path(__file__).resolve().parent.parent
CODED = catalogue.coded()


def write_inputs(folder: Path, example: dict) -> list[str]:
    """Lay an example out as a user has it (a model folder, a training config, --with, --gpu); the check arguments."""
    model = folder / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(catalogue.example_config(example)))
    if "tokenizer_config" in example:
        (model / "tokenizer_config.json").write_text(json.dumps(example["tokenizer_config"]))
    args = ["check", str(model), "--format", "json"]
    if "training" in example:
        tc = folder / "train.json"
        tc.write_text(json.dumps(example["training"]))
        args += ["--training-config", str(tc)]
    for w in example.get("with", []):
        args += ["--with", w]
    args += ["--gpu", example.get("gpu", "A100")]
    return args


def findings(cli, folder: Path, example: dict) -> dict[str, str]:
    r = cli(*write_inputs(folder, example))
    doc = r.json()
    return {f["code"]: f["severity"] for m in doc["models"] for f in m["findings"]}


def test_catalogue_validates():
    assert catalogue.problems() == []
    assert len(catalogue.entries()) >= 40
    assert {e["triage"] for e in catalogue.entries()} == set(catalogue.TRIAGE)


def test_validation_catches_a_broken_entry():
    doc = json.loads(catalogue.FILE.read_text())
    bad = doc["entries"][0]
    bad["windows"] = {"trl": ">=0.19.0,<1.2.0"}  # disagrees with the condition
    bad["when"]["training"]["no_such_setting"] = True
    bad["when"]["training"]["assistant_only_loss"] = {"approximately": True}
    bad["triage"] = "guessed"
    doc["entries"][1]["model_types"] = ["gemma5"]  # a member no registry knows: a crash could never match it
    out = "\n".join(catalogue.problems(doc))
    assert "disagree" in out and "no_such_setting" in out and "guessed" in out and "not a matcher" in out
    assert "model_types must be a non-empty list of known model types" in out


def test_every_code_is_in_codes_py_and_docs_are_generated():
    for e in CODED:
        assert CODES[e["code"]].name == e["name"]
    # GD701-GD739 and GD780-GD799 are the catalogue's; GD74x-GD77x are after-training's own rules (rules/after.py)
    assert {c for c in CODES if c.startswith("GD7") and not 740 <= int(c[2:]) < 780} == {e["code"] for e in CODED}
    gen = runpy.run_path(str(ROOT / "docs" / "gen_catalogue.py"))
    findings_md, codes_py, recall_md = gen["render"]()
    assert (ROOT / "docs" / "findings.md").read_text() == findings_md, "run: python docs/gen_catalogue.py"
    assert (ROOT / "gemma_doctor" / "codes.py").read_text() == codes_py, "run: python docs/gen_catalogue.py"
    assert (ROOT / "docs" / "field-recall.md").read_text() == recall_md, "run: python docs/gen_catalogue.py"


@pytest.mark.parametrize("entry", CODED, ids=[e["code"] for e in CODED])
def test_entry_fires_on_its_positive_example_only(cli, tmp_path, entry):
    pos = findings(cli, tmp_path / "pos", entry["examples"]["positive"])
    neg = findings(cli, tmp_path / "neg", entry["examples"]["negative"])
    assert pos.get(entry["code"]) == entry["severity"], pos
    assert entry["code"] not in neg, neg


def test_every_entry_detectable_from_files_raises_a_finding():
    """An entry triaged detectable (yes) has its own condition or names the earlier codes that catch it."""
    assert [e["id"] for e in catalogue.entries() if e["detectable"] == "yes" and not (e.get("code") or e.get("covered_by"))] == []
    assert [e["id"] for e in catalogue.entries() if e.get("covered_by") and not set(e["covered_by"]) <= set(CODES)] == []


CORPUS = json.loads((ROOT / "benchmarks" / "field_corpus.json").read_text())["reports"]
DETECTABLE = [r for r in CORPUS if r["detectable"] == "yes"]


@pytest.mark.parametrize("report", DETECTABLE, ids=[r["id"] for r in DETECTABLE])
def test_field_reports_detectable_from_files_are_caught(cli, tmp_path, report):
    """benchmarks/field_recall.py's corpus, in process: every report whose inputs show the failure is caught."""
    example = dict(report["inputs"], gpu=report["inputs"].get("gpu", "none"))
    codes = findings(cli, tmp_path, example)
    assert set(codes) & set(report["expect"]), (report["id"], sorted(codes))


def test_unknown_version_downgrades_and_unused_package_stays_silent(cli, tmp_path):
    # GD707 (vLLM < 0.8.0): a range that straddles the window is UNKNOWN -> warning; vLLM not named -> nothing.
    example = {"config": "gemma3", "with": ["vllm>=0.7,<0.9"]}
    assert findings(cli, tmp_path / "a", example).get("GD707") == "warning"
    assert "GD707" not in findings(cli, tmp_path / "b", {"config": "gemma3", "with": ["peft==0.18.1"]})


def test_a_condition_on_a_missing_file_is_not_guessed(cli, tmp_path):
    # GD702 needs tokenizer_config.json and the training config; without the training config it stays silent.
    example = dict(next(e for e in CODED if e["code"] == "GD702")["examples"]["positive"])
    example.pop("training")
    assert "GD702" not in findings(cli, tmp_path, example)


@pytest.mark.parametrize(("matcher", "value", "expected"), [
    (True, "yes", True), (True, _MISSING, False), (False, False, True), (False, _MISSING, False),
    ("absent", _MISSING, True), ("present", None, True), ("bfloat16", "torch.bfloat16", True),
    ({"in": [None, "sdpa"]}, _MISSING, True), ({"in": [None, "sdpa"]}, "eager", False),
    ({"not_in": [None]}, _MISSING, True), ({"not_in": [None]}, None, False), ({"gte": 2}, 2, True),
    ({"gte": 2}, True, False), ({"lacks": "vision"}, ["re:vision_tower.*"], False), ({"lacks": "vision"}, _MISSING, True),
    ({"contains": "router"}, "re:.*router.*", True),
])
def test_matchers(matcher, value, expected):
    assert match(matcher, value) is expected


# --- reproductions (CPU, the test stack's transformers and TRL) ------------------------------------------------

GEMMA_TEMPLATE = catalogue.load()["entries"][0]["examples"]["positive"]["tokenizer_config"]["chat_template"]


def _tiny_tokenizer(tmp_path: Path, chat_template: str | None = None):
    """A word-level tokenizer with Gemma's special tokens, saved and loaded back as transformers does it."""
    from tokenizers import Tokenizer, processors
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "user", "model", "hello", "hi",
             "there", "the", "answer", "is", "42", "\n"]
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>", additional_special_tokens=["<start_of_turn>", "<end_of_turn>"])
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(tmp_path)
    return AutoTokenizer.from_pretrained(tmp_path)


def test_gemma_template_without_generation_gives_an_all_zero_mask(tmp_path):
    """GD701/GD702: Gemma's stock template has no {% generation %}: the assistant mask is all zeros; TRL's training
    template for it (the cure TRL >= 1.3.0 swaps in) marks the model's turn."""
    from trl.chat_template_utils import gemma_training_chat_template

    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "the answer is 42"}]
    stock = _tiny_tokenizer(tmp_path / "stock", GEMMA_TEMPLATE)
    out = stock.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert sum(out["assistant_masks"]) == 0 and len(out["input_ids"]) > 0
    cured = _tiny_tokenizer(tmp_path / "cured", gemma_training_chat_template)
    out = cured.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert sum(out["assistant_masks"]) > 0
    assert catalogue.load()["entries"][0]["code"] == "GD701"


def test_add_bos_token_false_drops_bos_from_raw_text(tmp_path):
    """GD704: transformers' GemmaTokenizer built with add_bos_token=False (as Gemma 4's ships, per the reports) encodes
    raw text without <bos>, also after save and reload; with True, <bos> comes first."""
    from transformers import AutoTokenizer, GemmaTokenizer

    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<bos>", "<unk>", "\u2581the", "\u2581answer", "\u2581"])}
    text = "the answer"
    for flag in (False, True):
        GemmaTokenizer(vocab=vocab, merges=[], add_bos_token=flag).save_pretrained(tmp_path / str(flag))
        ids = AutoTokenizer.from_pretrained(tmp_path / str(flag))(text)["input_ids"]
        assert (ids[0] == vocab["<bos>"]) is flag, ids


@pytest.mark.slow
def test_trl_refuses_padding_free_without_packing(tmp_path):
    """GD713: TRL >= 1.0.0 raises at SFTTrainer construction for padding_free without packing while max_length is
    set (default 1024); packing makes it go away."""
    import torch
    from datasets import Dataset
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    from trl import SFTConfig, SFTTrainer

    tok = _tiny_tokenizer(tmp_path / "tok")
    config = Gemma3TextConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=8, sliding_window=8,
                              pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config)
    data = Dataset.from_dict({"text": ["hello there", "the answer is 42"]})
    common = dict(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True, max_steps=1, padding_free=True)
    with pytest.raises(ValueError, match="without packing, `max_length` is not enforced"):
        SFTTrainer(model=model, args=SFTConfig(**common), train_dataset=data, processing_class=tok)
    SFTTrainer(model=model, args=SFTConfig(**common, packing=True), train_dataset=data, processing_class=tok)


def test_old_layout_lora_regex_matches_nothing_on_current_transformers():
    """GD730 (axolotl #2834): from transformers 4.52 a multimodal Gemma 3's language model lives under
    model.language_model.layers, so a target regex written for language_model.model.layers finds nothing and PEFT
    refuses; the same regex in the new layout wraps every projection. (4.51.3 + PEFT 0.15.2 behave the other way
    round, GD731: measured by hand with this code in the shared venv.)"""
    import transformers
    from packaging.version import Version
    from peft import LoraConfig, get_peft_model
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    assert Version(transformers.__version__) >= Version("4.52.0")
    config = Gemma3Config(
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, vocab_size=300, sliding_window=16),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        mm_tokens_per_image=4, image_token_index=299, boi_token_index=297, eoi_token_index=298)
    projections = r"layers.[\d]+.(mlp|cross_attn|self_attn).(up|down|gate|q|k|v|o)_proj"
    with pytest.raises(ValueError, match="not found in the base model"):
        get_peft_model(Gemma3ForConditionalGeneration(config),
                       LoraConfig(r=4, target_modules="language_model.model." + projections))
    model = get_peft_model(Gemma3ForConditionalGeneration(config),
                           LoraConfig(r=4, target_modules="model.language_model." + projections))
    assert sum(1 for name, _ in model.named_modules() if name.endswith("lora_A")) == 14  # 2 layers x 7 projections
    gd730 = next(e for e in CODED if e["code"] == "GD730")
    assert "language_model.model.layers" in gd730["examples"]["positive"]["training"]["lora_target_modules"]


# axolotl 0.19.0 (the newest release) without its dependencies' stack: its chat_template module needs only colorama
# and addict beside transformers; its config validation (the rehearsal runs it first, as `axolotl train` does) also
# pillow, which its multimodal schema imports.
AXOLOTL = ("axolotl==0.19.0", "colorama==0.4.6", "addict==2.4.0", "pillow==13.0.0")


@pytest.mark.slow
def test_axolotl_chat_template_leaves_gemma_s_turn_end_untrained(tmp_path, cli):
    """GD780: axolotl's ChatTemplateStrategy defaults eot_tokens to [eos_token]; Gemma's template never emits <eos>,
    so <end_of_turn> after the model's turn is labelled -100 (never trained: the model does not learn to stop);
    with eot_tokens it is trained. The check says so on the config before, and not after."""
    import subprocess
    import sys

    from tests.venvs import ensure_packages, subprocess_env

    _tiny_tokenizer(tmp_path / "tok", GEMMA_TEMPLATE)
    env = subprocess_env(PYTHONPATH=f"{ensure_packages(AXOLOTL)}:{ROOT}")
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "scripts" / "axolotl_eot.py"), str(tmp_path / "tok")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["default"]["end_of_turn_labels"][-1] == -100 and "<end_of_turn>" not in got["default"]["trained"]
    assert got["eot_tokens"]["end_of_turn_labels"][-1] != -100 and got["eot_tokens"]["trained"][-1] == "<end_of_turn>"

    entry = next(e for e in catalogue.entries() if e["id"] == "axolotl-gemma-eot-untrained")
    assert findings(cli, tmp_path / "before", entry["examples"]["positive"]).get("GD780") == "warning"
    assert "GD780" not in findings(cli, tmp_path / "after", entry["examples"]["negative"])


def test_a_template_saved_apart_by_transformers_is_read(tmp_path, cli):
    """transformers 5.x writes the chat template to chat_template.jinja, not tokenizer_config.json: the template
    entries (here GD702, assistant_only_loss on Gemma 3's stock template) read it there. Before, a tokenizer saved by
    the installed transformers had no template as far as check could tell, and GD702 stayed silent."""
    entry = next(e for e in CODED if e["code"] == "GD702")
    example = {k: v for k, v in entry["examples"]["positive"].items() if k != "tokenizer_config"}
    args = write_inputs(tmp_path, example)
    model = tmp_path / "model"
    _tiny_tokenizer(model, entry["examples"]["positive"]["tokenizer_config"]["chat_template"])
    assert (model / "chat_template.jinja").is_file()
    assert "chat_template" not in json.loads((model / "tokenizer_config.json").read_text())
    doc = cli(*args).json()
    assert {f["code"] for f in doc["models"][0]["findings"]} >= {"GD702"}
    # A template file that is a link out of the repo folder is refused unread, as every file of a cached repo is.
    from tests.builders import HubCache

    hub = HubCache(tmp_path / "hub")
    files = {n: (model / n).read_bytes() for n in ("config.json", "tokenizer_config.json", "tokenizer.json")}
    hub.add("acme/gemma-blob", {**files, "chat_template.jinja": (model / "chat_template.jinja").read_bytes()})
    snap = hub.add("acme/gemma-linked", files)
    (tmp_path / "outside.jinja").write_bytes((model / "chat_template.jinja").read_bytes())
    (snap / "chat_template.jinja").symlink_to(tmp_path / "outside.jinja")

    def codes(repo: str) -> set[str]:
        r = cli("check", repo, "--cache-dir", str(hub.root), "--format", "json", "--gpu", "A100",
                "--training-config", str(tmp_path / "train.json"), "--with", "trl==1.2.0")
        return {f["code"] for f in r.json()["models"][0]["findings"]}

    assert "GD702" in codes("acme/gemma-blob")
    assert "GD702" not in codes("acme/gemma-linked")
