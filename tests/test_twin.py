"""The twin (gemma_doctor/rehearse/twin.py): for every family member, a shrunken random model with the original's class,
layer pattern, key layout, dtypes and tokenizer ids, laid out as a hub cache that loads by repo id offline.

Originals are real checkpoints: tests/tiny_family.py saved by the installed transformers, and the bundled example
snapshots (examples/build_example_cache.py: real configs, real tensor names and dtypes, a 4.50-era key layout).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from gemma_doctor.rehearse.twin import TwinError, build_twin
from tests import builders
from tests.builders import HubCache

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors import safe_open  # noqa: E402

from tests import tiny_family  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MEMBERS = sorted(tiny_family.SPECS)
# Members the installed stack cannot build, with the reason the twin must give (the real checkpoint fails the same).
REFUSED = {"gemma3n": "timm", "gemma4_assistant": "producing a cache", "gemma4_unified_assistant": "producing a cache"}
# tiny_family saves these with a stand-in's weights (their own class cannot be built here): keys are not theirs.
STAND_INS = {t for t, (_a, _m, stand_in) in tiny_family.SPECS.items() if stand_in}
GEMMA_IDS = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<start_of_turn>": 105, "<end_of_turn>": 106}
LAYER = re.compile(r"^(.*?\.?(?:layers|blocks))\.(\d+)\.")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, tuple[Path, Path, object]]:
    """model_type -> (original folder, original snapshot, Twin or TwinError): every member built once."""
    root = tmp_path_factory.mktemp("twins")
    torch.set_num_threads(1)
    hub = HubCache(root / "hub")
    out: dict[str, tuple[Path, Path, object]] = {}
    for model_type in MEMBERS:
        folder = tiny_family.save(model_type, root / "orig" / model_type)
        snap = hub.add(f"org/{model_type}", {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()})
        try:
            twin: object = build_twin(snap, f"org/{model_type}", root / "twin" / model_type)
        except TwinError as e:
            twin = e
        out[model_type] = (folder, snap, twin)
    return out


def _twin(built, model_type):
    folder, snap, twin = built[model_type]
    if model_type in REFUSED:
        assert isinstance(twin, TwinError) and REFUSED[model_type] in str(twin), twin
        assert "\n" not in str(twin)
        pytest.skip(f"{model_type}: the installed stack cannot build it ({twin})")
    assert not isinstance(twin, Exception), twin
    return folder, snap, twin


def _header(path: Path) -> dict[str, str]:
    with safe_open(str(path), "pt") as f:
        return {k: str(f.get_slice(k).get_dtype()) for k in f.keys()}


def _kept(original: set[str], twin: set[str]) -> set[str]:
    """The original's keys whose layer indices exist in the twin (each stack's count shrinks, names do not)."""
    top: dict[str, int] = {}
    for key in twin:
        for m in LAYER.finditer(key):
            top[m.group(1)] = max(top.get(m.group(1), -1), int(m.group(2)))
    return {k for k in original
            if all(int(m.group(2)) <= top.get(m.group(1), -1) for m in LAYER.finditer(k))}


def _text(config: dict) -> dict:
    for key in ("text_config", "decoder"):
        if isinstance(config.get(key), dict):
            return config[key]
    return config


@pytest.mark.parametrize("model_type", MEMBERS)
def test_twin_keeps_class_keys_and_dtypes(built, model_type):
    folder, _snap, twin = _twin(built, model_type)
    original = json.loads((folder / "config.json").read_text())
    assert twin.architecture == original["architectures"][0]
    assert twin.config["model_type"] == original["model_type"]
    theirs, ours = _header(folder / "model.safetensors"), _header(twin.snapshot / "model.safetensors")
    if model_type not in STAND_INS:
        assert set(ours) == _kept(set(theirs), set(ours))
        assert twin.layout == "checkpoint"
    assert {k: theirs[k] for k in ours} == ours  # each tensor in the checkpoint's own dtype


@pytest.mark.parametrize("model_type", MEMBERS)
def test_twin_keeps_layer_pattern_and_flags(built, model_type):
    folder, _snap, twin = _twin(built, model_type)
    original = transformers.AutoConfig.from_pretrained(folder)
    copy = transformers.AutoConfig.from_pretrained(twin.snapshot)
    o, t = original.get_text_config(), copy.get_text_config()
    for name in ("layer_types", "block_types"):
        if getattr(o, name, None):
            n = len(getattr(t, name))
            assert list(getattr(t, name)) == list(getattr(o, name))[:n]
            assert len(set(getattr(t, name))) == len(set(getattr(o, name)))  # every layer kind is still there
    for name in ("num_kv_shared_layers", "num_experts", "hidden_size_per_layer_input"):
        assert bool(getattr(o, name, 0)) == bool(getattr(t, name, 0)), name
    for name in ("vocab_size", "final_logit_softcapping", "attn_logit_softcapping", "sliding_window",
                 "tie_word_embeddings", "rope_parameters", "vocab_size_per_layer_input"):
        assert getattr(o, name, None) == getattr(t, name, None), name
    assert getattr(original, "tie_word_embeddings", None) == getattr(copy, "tie_word_embeddings", None)
    for tower in ("vision_config", "audio_config"):
        assert (getattr(original, tower, None) is None) == (getattr(copy, tower, None) is None), tower


@pytest.mark.parametrize("model_type", MEMBERS)
def test_twin_loads_by_repo_id_offline_and_runs(built, model_type):
    _folder, _snap, twin = _twin(built, model_type)
    cls = getattr(transformers, twin.architecture)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, info = cls.from_pretrained(f"org/{model_type}", cache_dir=twin.cache_dir, local_files_only=True,
                                          output_loading_info=True)
    if model_type not in STAND_INS:
        assert not info["missing_keys"] and not info["unexpected_keys"], info
    tok = transformers.AutoTokenizer.from_pretrained(f"org/{model_type}", cache_dir=twin.cache_dir,
                                                     local_files_only=True)
    assert {t: tok.convert_tokens_to_ids(t) for t in GEMMA_IDS} == GEMMA_IDS
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (2, 1, 0)
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, return_dict=True,
                                  return_tensors="pt")["input_ids"]
    assert ids[0, :2].tolist() == [2, 105]
    kwargs = {"input_ids": ids}
    if "t5gemma" in model_type:
        kwargs["decoder_input_ids"] = ids
    if model_type == "shieldgemma2":
        pytest.skip("ShieldGemma 2 classifies images: its forward needs pixel values (tested loading only)")
    with torch.no_grad():
        out = model(**kwargs)
    first = out[0] if not hasattr(out, "logits") or out.logits is None else out.logits
    assert torch.isfinite(first.float()).all()


def test_synthetic_tokenizer_is_said(built):
    _folder, _snap, twin = _twin(built, "gemma3")
    assert twin.shrunk["tokenizer"] == ("real", "synthetic")
    assert any("synthetic" in n for n in twin.notes)


def test_hub_layout_is_huggingface_hubs(built):
    from huggingface_hub import scan_cache_dir

    _folder, snap, twin = _twin(built, "gemma3")
    info = scan_cache_dir(twin.cache_dir)
    assert not info.warnings
    (repo,) = info.repos
    assert repo.repo_id == "org/gemma3"
    (rev,) = repo.revisions
    assert rev.commit_hash == snap.name == twin.commit  # the target's own commit: pinned revisions resolve
    assert rev.refs == frozenset({"main"})
    assert {f.file_name for f in rev.files} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert all(os.readlink(p).startswith("../../blobs/") for p in twin.snapshot.iterdir())


# --- the bundled examples: real configs, real tensor names (a 4.50-era layout for Gemma 3) --------------------------

@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("examples")
    subprocess.run([sys.executable, str(ROOT / "examples" / "build_example_cache.py"), str(dest)], check=True,
                   capture_output=True)
    return dest


def _snapshot(cache: Path, repo_id: str) -> Path:
    return next((cache / ("models--" + repo_id.replace("/", "--")) / "snapshots").iterdir())


def _index_keys(snap: Path) -> set[str]:
    return set(json.loads((snap / "model.safetensors.index.json").read_text())["weight_map"])


@pytest.fixture(scope="module")
def gemma3_12b(examples, tmp_path_factory):
    snap = _snapshot(examples, "google/gemma-3-12b-it")
    return snap, build_twin(snap, "google/gemma-3-12b-it", tmp_path_factory.mktemp("g3"))


def test_gemma3_12b_twin_keeps_the_450_layout(gemma3_12b):
    snap, twin = gemma3_12b
    ours = _header(twin.snapshot / "model.safetensors")
    theirs = _index_keys(snap)
    assert any(k.startswith("language_model.model.layers.") for k in ours)  # as 4.50 saved it, not as 5.x does
    assert set(ours) == _kept(theirs, set(ours))
    assert set(ours.values()) == {"BF16"}
    assert twin.shrunk["text_config.num_hidden_layers"] == (48, 6)  # one period of 5 sliding + 1 full
    assert twin.shrunk["text_config.head_dim"] == (256, 16)
    assert twin.config["text_config"]["hidden_size"] == 64
    assert twin.config["vision_config"]["image_size"] == 896  # the processor's geometry is kept
    assert twin.config["image_token_index"] == 262144


@pytest.mark.slow
def test_gemma3_12b_twin_loads_as_the_user_would(gemma3_12b):
    """The contract: AutoModelForCausalLM.from_pretrained(repo id) with HF_HUB_CACHE and HF_HUB_OFFLINE loads it."""
    _snap, twin = gemma3_12b
    script = (
        "import torch, transformers as T\n"
        "m, info = T.AutoModelForCausalLM.from_pretrained('google/gemma-3-12b-it', output_loading_info=True)\n"
        "tok = T.AutoTokenizer.from_pretrained('google/gemma-3-12b-it')\n"
        "ids = tok.apply_chat_template([{'role': 'user', 'content': 'hi'}], add_generation_prompt=True,"
        " return_dict=True, return_tensors='pt')['input_ids']\n"
        "out = m(input_ids=ids, labels=ids)\n"
        "print(type(m).__name__, m.dtype, sorted(k for k, v in info.items() if v), len(tok),"
        " bool(torch.isfinite(out.loss)), m.config.text_config.layer_types)\n")
    env = {**os.environ, "HF_HUB_CACHE": str(twin.cache_dir), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[:5] == ["Gemma3ForConditionalGeneration", "torch.bfloat16", "[]", "262208", "True"]
    assert "['sliding_attention', 'sliding_attention', 'sliding_attention', 'sliding_attention', " \
           "'sliding_attention', 'full_attention']" in run.stdout


def test_gemma4_e2b_twin_keeps_kv_sharing_and_per_layer_inputs(examples, tmp_path):
    snap = _snapshot(examples, "google/gemma-4-E2B-it")
    twin = build_twin(snap, "google/gemma-4-E2B-it", tmp_path)
    text = twin.config["text_config"]
    assert twin.shrunk["text_config.num_hidden_layers"] == (35, 10)  # two periods of 4 sliding + 1 full
    assert twin.shrunk["text_config.num_kv_shared_layers"] == (20, 5)  # the second period reuses the first's KV
    assert text["layer_types"] == (["sliding_attention"] * 4 + ["full_attention"]) * 2
    assert text["global_head_dim"] == 2 * text["head_dim"]  # 512 vs 256 kept as a ratio
    assert text["vocab_size_per_layer_input"] == 262144 and text["hidden_size_per_layer_input"] == 8
    ours = _header(twin.snapshot / "model.safetensors")
    # the twin's layers 5-9 stand for the original's shared layers 15-34 (which hold no k/v projections of their own)
    prefix = "model.language_model.layers."
    moved = {re.sub(r"^model\.language_model\.layers\.(\d+)\.",
                    lambda m: f"{prefix}{int(m.group(1)) + (10 if int(m.group(1)) >= 5 else 0)}.", k) for k in ours}
    theirs = _index_keys(snap)
    assert moved <= theirs
    for twin_layer, their_layer in ((0, 0), (4, 4), (5, 15), (9, 19)):
        mine = {k.split(".", 4)[-1] for k in ours if k.startswith(f"{prefix}{twin_layer}.")}
        assert mine == {k.split(".", 4)[-1] for k in theirs if k.startswith(f"{prefix}{their_layer}.")}
    assert {k for k in theirs if not k.startswith(prefix) and ".layers." not in k} <= set(ours)
    assert any(k.startswith("model.audio_tower.") for k in ours) and any(k.startswith("model.vision_tower.")
                                                                        for k in ours)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained("google/gemma-4-E2B-it", cache_dir=tmp_path,
                                                                  local_files_only=True)
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=torch.tensor([[2, 105, 200, 106]])).logits.float()).all()


# --- hostile targets: one line, a TwinError, never a hang -----------------------------------------------------------

def _target(hub: HubCache, files: dict) -> Path:
    return hub.add("org/hostile", files)


GOOD = {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "vocab_size": 262144,
        "hidden_size": 1152, "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1}


@pytest.mark.parametrize("files, message", [
    ({"generation_config.json": {}}, "config.json missing"),
    ({"config.json": b"{not json"}, "config.json cannot be used"),
    ({"config.json": b"[1, 2]"}, "config.json cannot be used"),
    ({"config.json": {**GOOD, "vocab_size": 10**12}}, "beyond any Gemma checkpoint"),
    ({"config.json": {**GOOD, "num_hidden_layers": 10**9}}, "beyond any Gemma checkpoint"),
    ({"config.json": {**GOOD, "num_hidden_layers": "many"}}, "not a count"),
    ({"config.json": {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}}, "not a Gemma-family member"),
    # each kept size within bounds, together 600 M parameters: refused as counted on the meta device, unallocated
    ({"config.json": {"model_type": "gemma3n_text", "architectures": ["Gemma3nForCausalLM"],
                      "vocab_size": 4 * 1024 * 1024, "vocab_size_per_layer_input": 4 * 1024 * 1024}}, "parameters"),
    ({"config.json": {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"},
                      "vision_config": {"model_type": "siglip_vision_model", "image_size": 10**6, "patch_size": 1}}},
     "patches"),
    ({"config.json": {**GOOD, "model_type": None}}, "not a Gemma-family member"),
])
def test_hostile_target_is_one_line(hub, tmp_path, files, message):
    snap = _target(hub, files)
    with pytest.raises(TwinError) as e:
        build_twin(snap, "org/hostile", tmp_path / "twin")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_link_out_of_the_cache_is_refused(hub, tmp_path):
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps(GOOD))
    snap = _target(hub, {"generation_config.json": {}})
    os.symlink(outside, snap / "config.json")
    with pytest.raises(TwinError, match="link out of the cache"):
        build_twin(snap, "org/hostile", tmp_path / "twin")


def test_fifo_config_does_not_hang(hub, tmp_path):
    snap = _target(hub, {"generation_config.json": {}})
    os.mkfifo(snap / "config.json")
    with pytest.raises(TwinError, match="not a regular file"):
        build_twin(snap, "org/hostile", tmp_path / "twin")


def test_bad_repo_id_and_missing_folder(tmp_path):
    with pytest.raises(TwinError, match="not a folder"):
        build_twin(tmp_path / "nope", "org/x", tmp_path / "twin")
    with pytest.raises(TwinError, match="not a repo id"):
        build_twin(tmp_path, "../../etc", tmp_path / "twin")


# --- real sizes: the shrinking itself (tiny_family's checkpoints are already small) ---------------------------------

def _gemma4_moe() -> dict:
    """A 26B-A4B-like Gemma 4 text config: 30 layers of 5 sliding + 1 full, 128 experts of which 8 are active."""
    text = json.loads((ROOT / "examples" / "google--gemma-4-E2B-it" / "config.json").read_text())["text_config"]
    text = {k: v for k, v in text.items() if k not in ("layer_types",)}
    return {**text, "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "dtype": "bfloat16",
            "hidden_size": 2816, "num_hidden_layers": 30, "num_attention_heads": 16, "num_key_value_heads": 8,
            "num_global_key_value_heads": 2, "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5,
            "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 0,
            "enable_moe_block": True, "num_experts": 128, "top_k_experts": 8, "moe_intermediate_size": 704,
            "intermediate_size": 2112}


REAL_SIZES = {
    "gemma-2b": {"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "hidden_size": 2048,
                 "num_hidden_layers": 18, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
                 "intermediate_size": 16384, "vocab_size": 256000, "torch_dtype": "bfloat16"},
    "gemma-2-2b": {**builders.gemma2_config(), "num_attention_heads": 8,
                   "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 9216, "query_pre_attn_scalar": 256},
    "gemma-3-1b": builders.gemma3_1b_config(),
    # a multimodal Gemma 3 whose text config is left wholly to the defaults (2304 wide, 26 layers)
    "gemma-3-defaults": {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                         "torch_dtype": "bfloat16", "vision_config": {"model_type": "siglip_vision_model"}},
    "paligemma2": builders.paligemma2_config(),
    "gemma-4-26b-a4b-like": _gemma4_moe(),
}


@pytest.mark.parametrize("name", sorted(REAL_SIZES))
def test_real_sizes_shrink_and_run(hub, tmp_path, name):
    config = REAL_SIZES[name]
    snap = hub.add(f"org/{name}", {"config.json": config})
    twin = build_twin(snap, f"org/{name}", tmp_path / "twin")
    assert twin.layout == "installed" and any("no safetensors" in n for n in twin.notes)
    text = _text(twin.config)
    assert text["hidden_size"] == 64 and text.get("num_hidden_layers", 2) <= 6
    assert 0 < twin.parameters < 60_000_000  # the real vocabulary x 64 dominates
    if name.startswith("gemma-4"):
        assert (text["num_experts"], text["top_k_experts"], text["moe_intermediate_size"]) == (4, 2, 32)
        assert text["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = getattr(transformers, twin.architecture).from_pretrained(
            f"org/{name}", cache_dir=twin.cache_dir, local_files_only=True)
    assert model.dtype == torch.bfloat16  # the config's dtype, where the checkpoint has no headers to read
    if model.config.get_text_config().tie_word_embeddings:  # a tied head is saved once, as save_pretrained does
        assert not any("lm_head" in k for k in _header(twin.snapshot / "model.safetensors"))
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=torch.tensor([[2, 105, 300, 106]])).logits.float()).all()


def test_real_tokenizer_files_are_copied_as_they_are(built, hub, tmp_path):
    _folder, _snap, first = _twin(built, "gemma3_text")
    files = {"config.json": json.loads((first.snapshot / "config.json").read_text())}
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        files[name] = (first.snapshot / name).read_bytes() + (b"\n" if name == "tokenizer_config.json" else b"")
    snap = hub.add("org/with-tokenizer", files)
    twin = build_twin(snap, "org/with-tokenizer", tmp_path / "twin")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (twin.snapshot / name).read_bytes() == (snap / name).read_bytes()
    assert "tokenizer" not in twin.shrunk and not any("synthetic" in n for n in twin.notes)


def test_adapter_twin_carries_the_adapters_config(built, hub, tmp_path):
    from peft import PeftModel

    _folder, _snap, base = _twin(built, "gemma3_text")
    adapter_config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8,
                      "target_modules": ["q_proj", "v_proj"], "base_model_name_or_path": "org/gemma3_text",
                      "some_future_key": 1}
    snap = hub.add("org/my-adapter", {"adapter_config.json": adapter_config})
    origin = built["gemma3_text"][1]
    twin = build_twin(origin, "org/gemma3_text", tmp_path / "twin", adapter_dir=snap)
    assert twin.adapter is not None and twin.adapter.parent.parent.name == "models--org--my-adapter"
    assert (twin.adapter / "adapter_config.json").read_bytes() == (snap / "adapter_config.json").read_bytes()
    assert any("some_future_key" in n for n in twin.notes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base_model = transformers.AutoModelForCausalLM.from_pretrained("org/gemma3_text", cache_dir=tmp_path / "twin",
                                                                       local_files_only=True)
        model = PeftModel.from_pretrained(base_model, "org/my-adapter", cache_dir=tmp_path / "twin",
                                          local_files_only=True)
    b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert len(b) == 2 * 2 and all(p.abs().sum() > 0 for p in b)  # q and v of 2 layers; B moved off zero
    assert model.peft_config["default"].r == 4


def test_plain_adapter_folder_becomes_a_repo_of_the_twin_cache(built, tmp_path):
    from huggingface_hub import scan_cache_dir

    folder = tmp_path / "my adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4,
                                                            "target_modules": ["o_proj"]}))
    twin = build_twin(built["gemma3_text"][1], "org/gemma3_text", tmp_path / "twin", adapter_dir=folder)
    assert twin.adapter is not None and twin.adapter.parent.parent.name == "models--local--my-adapter"
    info = scan_cache_dir(tmp_path / "twin")
    assert not info.warnings and {r.repo_id for r in info.repos} == {"org/gemma3_text", "local/my-adapter"}


def test_adapter_whose_targets_match_nothing_is_one_line(built, hub, tmp_path):
    snap = hub.add("org/bad-adapter", {"adapter_config.json": {"peft_type": "LORA", "r": 2,
                                                               "target_modules": ["no_such_proj"]}})
    with pytest.raises(TwinError, match="PEFT cannot put the adapter on the twin: .*Target modules .* not found") as e:
        build_twin(built["gemma3_text"][1], "org/gemma3_text", tmp_path / "twin", adapter_dir=snap)
    assert "\n" not in str(e.value)


def test_importing_the_twin_and_real_weights_modules_imports_no_torch():
    code = ("import sys, gemma_doctor.rehearse.twin, gemma_doctor.rehearse.realweights\n"
            "print(sorted(m for m in ('torch', 'transformers', 'huggingface_hub', 'peft') if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_synthetic_tokenizer_names_the_image_tokens_as_gemma3s_does(gemma3_12b):
    _snap, twin = gemma3_12b
    tok = transformers.AutoTokenizer.from_pretrained(twin.snapshot)
    assert (tok.boi_token, tok.eoi_token, tok.image_token) == ("<start_of_image>", "<end_of_image>",
                                                              "<image_soft_token>")
    assert tok.convert_tokens_to_ids([tok.boi_token, tok.eoi_token, tok.image_token]) == [255999, 256000, 262144]
    assert len(tok) == 262208  # the model's vocabulary, not the config's largest token id
