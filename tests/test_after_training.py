"""`check` on what training leaves behind: PEFT adapters (with their base), Trainer checkpoints and merged models.

Every adapter here is trained and saved by the real PEFT of the main venv (0.21.2, transformers 5.23.0) on tiny
Gemma 3 checkpoints (tests/tiny_family.py); the checkpoint folder is written by the real Trainer. The reproduction
on PEFT 0.17.1-0.18.1, where a merge loses the trained head, is tests/test_after_training_repro.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.builders import HubCache, tree_state



def _probe():  # noqa: ANN202
    """The tokens whose logits a reloaded model is compared on."""
    import torch

    return torch.arange(3, 19).unsqueeze(0)


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """Tiny bases, adapters trained 3 steps, a merged model and a Trainer checkpoint, built once."""
    import torch
    import transformers as T
    from peft import LoraConfig, get_peft_model

    from tests import tiny_family

    root = tmp_path_factory.mktemp("after")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    out: dict[str, Path] = {}
    out["base"] = tiny_family.save("gemma3_text", root / "base")
    out["mm_base"] = tiny_family.save("gemma3", root / "mm_base")
    ids = torch.randint(3, 250, (2, 12))

    def train(name: str, base: Path, cls: type, **lora) -> object:
        model = get_peft_model(cls.from_pretrained(base, dtype=torch.float32), LoraConfig(r=4, lora_alpha=8, **lora))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        for _ in range(3):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
        model.save_pretrained(root / name)
        out[name] = root / name
        return model

    train("plain", out["base"], T.Gemma3ForCausalLM, target_modules=["q_proj", "v_proj"])
    mts = train("mts", out["base"], T.Gemma3ForCausalLM, target_modules=["q_proj", "v_proj"],
                modules_to_save=["embed_tokens", "lm_head"])
    train("tied", out["base"], T.Gemma3ForCausalLM, target_modules=["q_proj", "v_proj"],
          modules_to_save=["embed_tokens", "lm_head"], ensure_weight_tying=True)
    train("mm", out["mm_base"], T.Gemma3ForConditionalGeneration,
          target_modules=r".*language_model.*\.(q_proj|v_proj)")
    merged = mts.merge_and_unload().eval()
    with torch.no_grad():  # the trained model's logits, which a reload of the merged folder must give back
        torch.save(merged(input_ids=_probe()).logits, root / "merged-logits.pt")
    merged.save_pretrained(root / "merged")  # PEFT 0.21.2 unties the merged config itself
    out["merged"] = root / "merged"
    # A multimodal model whose head was trained apart (no PEFT merges one here: the head is set by hand), saved untied.
    mm = T.Gemma3ForConditionalGeneration.from_pretrained(out["mm_base"], dtype=torch.float32)
    mm.config.tie_word_embeddings = mm.config.text_config.tie_word_embeddings = False
    mm.lm_head.weight = torch.nn.Parameter(mm.get_input_embeddings().weight.detach() + 0.5)
    with torch.no_grad():
        torch.save(mm.eval()(input_ids=_probe()).logits, root / "mm-merged-logits.pt")
    mm.save_pretrained(root / "mm-merged")
    out["mm_merged"] = root / "mm-merged"

    # A Trainer run of 1 step with save_steps=1 leaves checkpoint-1 (trainer_state.json, optimizer.pt, the adapter).
    model = get_peft_model(T.Gemma3ForCausalLM.from_pretrained(out["base"], dtype=torch.float32),
                           LoraConfig(r=4, target_modules=["q_proj"]))
    data = [{"input_ids": ids[0], "labels": ids[0]}] * 2
    args = T.TrainingArguments(output_dir=str(root / "run"), max_steps=1, save_steps=1, per_device_train_batch_size=1,
                               report_to=[], use_cpu=True, disable_tqdm=True, logging_strategy="no")
    T.Trainer(model=model, args=args, train_dataset=data).train()
    out["checkpoint"] = root / "run" / "checkpoint-1"
    # The same for full fine-tuning: the checkpoint holds the model itself.
    full = T.Gemma3ForCausalLM.from_pretrained(out["base"], dtype=torch.float32)
    args = T.TrainingArguments(output_dir=str(root / "full"), max_steps=1, save_steps=1, per_device_train_batch_size=1,
                               report_to=[], use_cpu=True, disable_tqdm=True, logging_strategy="no")
    T.Trainer(model=full, args=args, train_dataset=data).train()
    out["full_checkpoint"] = root / "full" / "checkpoint-1"
    return out


def _check(cli, target: Path | str, *extra: str, cache: Path | None = None) -> dict:
    args = ["check", str(target), "--format", "json", "--fail-on", "never", "--gpu", "none", *extra]
    if cache is not None:
        args += ["--cache-dir", str(cache)]
    r = cli(*args)
    assert r.code == 0, r
    return r.json()["models"][0]


def _codes(model: dict) -> dict[str, dict]:
    return {f["code"]: f for f in model["findings"]}


def test_an_adapter_folder_is_an_adapter_not_a_model_without_config(cli, made, tmp_path):
    m = _check(cli, made["plain"], cache=tmp_path / "hub")
    assert "GD001" not in _codes(m)  # before issue 21: "config.json is missing: this folder is not a transformers model"
    assert m["kind"] == "adapter" and m["family"] == "gemma3"
    ad = m["adapter"]
    assert (ad["peft_type"], ad["rank"], ad["alpha"]) == ("LORA", 4, 8)
    assert sorted(ad["target_modules"]) == ["q_proj", "v_proj"] and ad["modules_to_save"] == []
    assert ad["peft_version"] == "0.21.2" and ad["layout"] == "model" and ad["prefixes"] == ["model"]
    assert ad["lora_tensors"] == 8 and ad["full_tensors"] == {} and ad["error"] is None
    assert m["base"] == {"name": str(made["base"]), "found": "folder", "path": str(made["base"]),
                         "model_type": "gemma3_text", "family": "gemma3", "note": None}
    assert _codes(m) == {}


def test_text_view_names_the_adapter_and_its_base(cli, made, tmp_path):
    r = cli("check", str(made["mts"]), "--gpu", "none", "--cache-dir", str(tmp_path / "hub"))
    assert "adapter: LORA r=4 alpha=8" in r.out and "modules_to_save embed_tokens, lm_head" in r.out
    assert f"base: {made['base']} (folder {made['base']}, model_type gemma3_text)" in r.out


def _naming(made: dict[str, Path], tmp_path: Path, base: str, which: str = "plain") -> Path:
    """A copy of the ``which`` adapter whose adapter_config.json names ``base`` as its base model."""
    adapter = tmp_path / "adapter"
    shutil.copytree(made[which], adapter)
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**cfg, "base_model_name_or_path": base}))
    return adapter


def test_the_base_is_found_in_the_cache_by_repo_id(cli, made, tmp_path):
    hub = HubCache(tmp_path / "hub")
    hub.add("acme/gemma-3-tiny", {n: (made["base"] / n).read_bytes() for n in ("config.json", "model.safetensors")})
    adapter = _naming(made, tmp_path, "acme/gemma-3-tiny")
    m = _check(cli, adapter, cache=hub.root)
    assert m["base"]["found"] == "cache" and m["base"]["model_type"] == "gemma3_text"
    assert m["base"]["path"].startswith(str(hub.repo_dir("acme/gemma-3-tiny") / "snapshots"))
    # Not cached, and the suite runs with HF_HUB_OFFLINE=1: reported with the reason (tests/test_hub.py reads such a
    # base from a local Hub).
    m = _check(cli, adapter, cache=tmp_path / "empty")
    assert m["base"]["found"] == "not found" and _codes(m)["GD742"]["severity"] == "info"
    assert "HF_HUB_OFFLINE is set" in m["base"]["note"] and m["base"]["note"] in _codes(m)["GD742"]["message"]


@pytest.mark.parametrize(("peft", "transformers", "severity"), [
    ("==0.18.1", "==4.57.6", "error"), ("==0.19.0", "==4.57.6", None), ("==0.18.1", "==5.0.0", None),
    (">=0.17", "==4.57.6", "warning"),  # a range across 0.19.0: unknown
])
def test_modules_to_save_on_the_tied_pair_warns_where_a_merge_loses_the_head(cli, made, tmp_path, peft, transformers,
                                                                              severity):
    plan = ["--with", f"peft{peft}", "--with", f"transformers{transformers}"]
    m = _check(cli, made["mts"], *plan, cache=tmp_path / "hub")
    assert sorted(m["adapter"]["full_tensors"]) == ["base_model.model.lm_head.weight",
                                                    "base_model.model.model.embed_tokens.weight"]
    got = _codes(m).get("GD751")
    assert (got["severity"] if got else None) == severity
    # ensure_weight_tying keeps the pair tied: nothing to lose at merge, whatever PEFT merges it.
    assert "GD751" not in _codes(_check(cli, made["tied"], *plan, cache=tmp_path / "hub"))


def test_vllm_refuses_modules_to_save(cli, made, tmp_path):
    assert _codes(_check(cli, made["mts"], cache=tmp_path / "hub"))["GD752"]["severity"] == "info"
    m = _check(cli, made["mts"], "--with", "vllm==0.10.0", cache=tmp_path / "hub")
    assert _codes(m)["GD752"]["severity"] == "warning" and "vllm #9280" in _codes(m)["GD752"]["message"]
    assert "GD752" not in _codes(_check(cli, made["plain"], "--with", "vllm==0.10.0", cache=tmp_path / "hub"))


def test_merged_head_under_a_tied_config_is_an_error(cli, made, tmp_path):
    merged = made["merged"]
    cfg = json.loads((merged / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False  # PEFT 0.21.2 unties the config at merge: the head is kept
    assert "GD750" not in _codes(_check(cli, merged))
    # What PEFT 0.17.1-0.18.1 write (tests/test_after_training_repro.py): the same head, the config left tied.
    for tie in ({"tie_word_embeddings": True}, {}):
        folder = tmp_path / f"merged-{len(tie)}"
        shutil.copytree(merged, folder)
        (folder / "config.json").write_text(json.dumps({**{k: v for k, v in cfg.items() if k != "tie_word_embeddings"},
                                                        **tie}))
        f = _codes(_check(cli, folder, "--with", "transformers==4.57.6"))["GD750"]
        assert f["severity"] == "error" and f["key"] == "tie_word_embeddings"
        assert f["details"] == {"head": "lm_head.weight", "embed": "model.embed_tokens.weight"}
        weighed = _codes(_check(cli, folder, "--weights", "--with", "transformers==4.57.6"))["GD750"]
        assert weighed["severity"] == "error" and weighed["details"]["max_abs_diff"] > 0
        # transformers 5.x loads the saved head; other loaders (vLLM) still read the tie flag.
        assert _codes(_check(cli, folder, "--with", "transformers==5.0.0"))["GD750"]["severity"] == "warning"


def test_a_saved_head_equal_to_the_embedding_is_harmless(cli, made, tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "same"
    shutil.copytree(made["merged"], folder)
    tensors = load_file(folder / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    plan = ("--with", "transformers==4.57.6")
    assert _codes(_check(cli, folder, *plan))["GD750"]["severity"] == "error"  # headers alone cannot tell
    assert _codes(_check(cli, folder, "--weights", *plan))["GD750"]["severity"] == "info"
    # fix compares the two itself: nothing is lost, so nothing is untied, and the duplicate tensor is not dropped.
    before = tree_state(folder)
    r = cli("fix", str(folder), "--inplace")
    assert r.code == 0 and "config.json stays tied" in r.out and "never rewrites a safetensors file" in r.out
    assert tree_state(folder) == before


def _reload_change(cls: type, folder: Path, want: Path, retie: bool = False) -> float:
    """How far the model transformers (5.23.0 here) loads from ``folder`` is from the trained one's logits; with
    ``retie``, after a later tie_weights() (resize_token_embeddings and others call it), which re-reads the config."""
    import torch

    model = cls.from_pretrained(folder, dtype=torch.float32).eval()
    if retie:
        model.tie_weights()
    with torch.no_grad():
        return (model(input_ids=_probe()).logits - torch.load(want)).abs().max().item()


def _tied_as_peft_0_17_leaves_it(folder: Path) -> bytes:
    """The config a PEFT < 0.19 merge leaves: the base's tie flags (true) beside the trained head."""
    raw = (folder / "config.json").read_text()
    assert raw.count('"tie_word_embeddings": false') >= 1
    (folder / "config.json").write_text(raw.replace('"tie_word_embeddings": false', '"tie_word_embeddings": true'))
    return (folder / "config.json").read_bytes()


@pytest.mark.parametrize("name,arch,keys", [
    ("merged", "Gemma3ForCausalLM", ["tie_word_embeddings"]),
    # transformers 5.x reads the top level for Gemma3ForConditionalGeneration, 4.x text_config: both are written.
    ("mm_merged", "Gemma3ForConditionalGeneration", ["tie_word_embeddings", "text_config.tie_word_embeddings"]),
])
def test_fix_unties_a_trained_head_and_the_reload_keeps_it(cli, made, tmp_path, name, arch, keys):
    import transformers as T

    folder = tmp_path / name
    shutil.copytree(made[name], folder)
    original = _tied_as_peft_0_17_leaves_it(folder)
    want, cls = made[name].parent / f"{made[name].name}-logits.pt", getattr(T, arch)
    # Before: 5.23.0 loads the saved head (it warns that the config is wrong), but the first tie_weights() after the
    # load re-reads the tied config and the trained head is gone (transformers 4.x loses it at load:
    # tests/test_after_training_repro.py).
    assert _reload_change(cls, folder, want) < 1e-5
    assert _reload_change(cls, folder, want, retie=True) > 0.1
    assert _codes(_check(cli, folder, "--with", "transformers==4.57.6"))["GD750"]["severity"] == "error"

    state = tree_state(folder)
    dry = cli("fix", str(folder), "--format", "json")
    assert dry.code == 0 and tree_state(folder) == state  # the diff first, nothing written
    model = dry.json()["models"][0]
    assert model["status"] == "would-change" and model["changes"][0]["keys"] == keys
    assert model["changes"][0]["diff"].count('+  "tie_word_embeddings": false') + \
        model["changes"][0]["diff"].count('+    "tie_word_embeddings": false') == len(keys)
    r = cli("fix", str(folder), "--inplace")
    assert r.code == 0 and "undo with: gemma-doctor restore" in r.out
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False and cfg.get("text_config", {}).get("tie_word_embeddings", False) is False
    # After: the trained head is loaded and stays, whatever ties later; check no longer raises GD750.
    assert _reload_change(cls, folder, want, retie=True) < 1e-5
    assert "GD750" not in _codes(_check(cli, folder, "--with", "transformers==4.57.6"))
    assert cli("fix", str(folder), "--inplace", "--format", "json").json()["models"][0]["status"] != "changed"

    assert cli("restore", str(folder)).code == 0
    assert (folder / "config.json").read_bytes() == original and not (folder / ".gemma-doctor").exists()
    assert tree_state(folder) == state


def test_a_multimodal_config_untied_at_one_level_only_is_still_tied(cli, made, tmp_path):
    """4.57.6 ties Gemma3ForConditionalGeneration by text_config's flag, 5.23.0 by the top level's (measured by hand
    on both, docs/after-training.md): either left true loses the head on one of them."""
    import transformers as T

    want = made["mm_merged"].parent / "mm-merged-logits.pt"
    for level in ("top", "text"):
        folder = tmp_path / level
        shutil.copytree(made["mm_merged"], folder)
        cfg = json.loads((folder / "config.json").read_text())
        if level == "top":
            cfg["text_config"]["tie_word_embeddings"] = True
        else:
            cfg["tie_word_embeddings"] = True
        (folder / "config.json").write_text(json.dumps(cfg))
        found = _codes(_check(cli, folder, "--with", "transformers==4.57.6"))["GD750"]
        assert found["key"] == ("text_config.tie_word_embeddings" if level == "top" else "tie_word_embeddings")
        if level == "text":  # 5.23.0 reads the top level: the head goes at the first tie_weights()
            assert _reload_change(T.Gemma3ForConditionalGeneration, folder, want, retie=True) > 0.1
        assert cli("fix", str(folder), "--inplace").code == 0
        assert "GD750" not in _codes(_check(cli, folder, "--with", "transformers==4.57.6"))
        assert _reload_change(T.Gemma3ForConditionalGeneration, folder, want, retie=True) < 1e-5


def test_multimodal_adapter_keys_and_the_transformers_4_52_layout(cli, made, tmp_path):
    m = _check(cli, made["mm"], cache=tmp_path / "hub")
    assert m["adapter"]["layout"] == "model.language_model" and m["base"]["model_type"] == "gemma3"
    assert "GD760" not in _codes(m)  # transformers 5.23.0 here has the layout the adapter was saved in
    assert _codes(_check(cli, made["mm"], "--with", "transformers==4.51.3"))["GD760"]["severity"] == "error"
    assert "GD760" not in _codes(_check(cli, made["mm"], "--with", "transformers==4.52.0"))
    assert _codes(_check(cli, made["mm"], "--with", "transformers>=4.40"))["GD760"]["severity"] == "warning"
    # A text-only model's keys (model.layers) are the same in every release.
    assert "GD760" not in _codes(_check(cli, made["plain"], "--with", "transformers==4.51.3"))


def test_a_trainer_checkpoint_is_recognised(cli, made, tmp_path):
    ckpt = made["checkpoint"]
    assert (ckpt / "trainer_state.json").is_file() and (ckpt / "optimizer.pt").is_file()
    m = _check(cli, ckpt, cache=tmp_path / "hub")
    assert m["kind"] == "checkpoint" and m["adapter"]["target_modules"] == ["q_proj"]
    assert m["base"]["found"] == "folder" and "GD001" not in _codes(m)
    # A full fine-tuning checkpoint is read as the model it holds.
    full = _check(cli, made["full_checkpoint"])
    assert (full["kind"], full["family"], full["model_type"]) == ("checkpoint", "gemma3", "gemma3_text")
    assert "adapter" not in full and full["dtypes"]["source"] == "model.safetensors"
    r = cli("check", str(made["full_checkpoint"]), "--gpu", "none")
    assert "Trainer checkpoint (trainer_state.json) of a model" in r.out
    # A plain model folder is a model.
    assert _check(cli, made["base"])["kind"] == "model"


@pytest.mark.parametrize("damage", ["no-weights", "bad-config", "bad-header"])
def test_a_damaged_adapter_is_a_finding_not_a_crash(cli, made, tmp_path, damage):
    adapter = tmp_path / "adapter"
    shutil.copytree(made["plain"], adapter)
    if damage == "no-weights":
        (adapter / "adapter_model.safetensors").unlink()
    elif damage == "bad-config":
        (adapter / "adapter_config.json").write_text("{not json")
    else:
        (adapter / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{broken")
    m = _check(cli, adapter, cache=tmp_path / "hub")
    assert m["kind"] == "adapter" and _codes(m)["GD741"]["severity"] == "error"
    assert "GD001" not in _codes(m)


@pytest.mark.parametrize(("base", "code", "says"), [
    ("/", "GD742", "whose config.json is missing"),        # a folder, but no model
    ("acme/\x1b[31mred", "GD742", "neither a folder"),      # not a repo id, not a folder: never printed raw
    ("", "GD742", "names no base model"),
    ("llama", "GD743", "not a Gemma-family model"),
])
def test_a_base_that_is_not_a_gemma_model_here_is_said_plainly(cli, made, tmp_path, monkeypatch, base, code, says):
    from tests.builders import llama_config

    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps(llama_config()))
    monkeypatch.chdir(tmp_path)  # a relative base name is a folder of the working directory, as for transformers
    adapter = _naming(made, tmp_path, base, "mts")
    found = _codes(_check(cli, adapter, "--with", "peft==0.17.1", "--with", "transformers==4.57.6",
                          cache=tmp_path / "hub"))
    assert says in found[code]["message"]
    assert ("GD751" in found) is (code == "GD742")  # the base is not read: Gemma's tie default is assumed
    r = cli("check", str(adapter), "--cache-dir", str(tmp_path / "hub"), "--gpu", "none")
    assert "\x1b" not in r.out


def test_fix_leaves_an_adapter_alone(cli, made, tmp_path):
    adapter = tmp_path / "adapter"
    shutil.copytree(made["mts"], adapter)
    before = {p.name: p.read_bytes() for p in adapter.iterdir()}
    r = cli("fix", str(adapter), "--inplace", "--with", "transformers==4.50.3")
    assert r.code == 0 and "a PEFT adapter" in r.out
    assert {p.name: p.read_bytes() for p in adapter.iterdir()} == before


def test_a_saved_multimodal_folder_without_its_processor(cli, made, tmp_path):
    folder = tmp_path / "sft-out"
    shutil.copytree(made["mm_base"], folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<bos>", "eos_token": "<eos>"}))
    f = _codes(_check(cli, folder))["GD770"]
    assert f["severity"] == "warning" and "trl #3110" in f["message"]
    (folder / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "Gemma3ImageProcessor"}))
    assert "GD770" not in _codes(_check(cli, folder))
    # A published snapshot is what its publisher uploaded: not judged as a training run's output.
    hub = HubCache(tmp_path / "hub")
    hub.add("acme/mm", {n: (made["mm_base"] / n).read_bytes() for n in ("config.json", "model.safetensors")}
            | {"tokenizer_config.json": {"bos_token": "<bos>"}})
    assert "GD770" not in _codes(_check(cli, "acme/mm", cache=hub.root))
    # A text model has no processor to lose.
    text = tmp_path / "text"
    shutil.copytree(made["base"], text)
    (text / "tokenizer_config.json").write_text("{}")
    assert "GD770" not in _codes(_check(cli, text))


def test_gguf_export_needs_tokenizer_model_for_gemma_2(cli, tmp_path):
    from tests import tiny_family

    folder = tiny_family.save("gemma2", tmp_path / "g2")
    (folder / "tokenizer.json").write_text("{}")
    assert _codes(_check(cli, folder))["GD771"]["severity"] == "info"
    (folder / "tokenizer.model").write_bytes(b"\x0a")
    assert "GD771" not in _codes(_check(cli, folder))


def test_an_adapter_repo_in_the_cache(cli, made, tmp_path):
    hub = HubCache(tmp_path / "hub")
    hub.add("acme/gemma-3-tiny", {n: (made["base"] / n).read_bytes() for n in ("config.json", "model.safetensors")})
    files = {n: (made["plain"] / n).read_bytes() for n in ("adapter_config.json", "adapter_model.safetensors")}
    cfg = json.loads(files["adapter_config.json"])
    hub.add("acme/tiny-lora", {**files, "adapter_config.json": {**cfg, "base_model_name_or_path": "acme/gemma-3-tiny"}})
    r = cli("check", "--cache-dir", str(hub.root), "--format", "json", "--gpu", "none")
    doc = r.json()
    assert [m["repo_id"] for m in doc["models"]] == ["acme/gemma-3-tiny"]
    assert doc["skipped"] == [{"target": "acme/tiny-lora", "path": doc["skipped"][0]["path"],
                               "reason": "a PEFT adapter; name it to check it"}]
    m = _check(cli, "acme/tiny-lora", cache=hub.root)
    assert (m["kind"], m["source"], m["base"]["found"], m["family"]) == ("adapter", "cache", "cache", "gemma3")


def test_an_adapter_read_from_the_hub_is_not_downloaded(made, tmp_path):
    import os
    import subprocess
    import sys

    from tests.hubserver import HubServer, repos_from_cache

    storage = HubCache(tmp_path / "storage")
    storage.add("acme/tiny-lora", {n: (made["mts"] / n).read_bytes()
                                   for n in ("adapter_config.json", "adapter_model.safetensors")})
    cache = tmp_path / "cache"
    with HubServer(repos_from_cache(storage.root)) as server:
        env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
        env.update(HF_ENDPOINT=server.endpoint, HF_HUB_CACHE=str(cache), HF_HOME=str(tmp_path / "home"))
        r = subprocess.run([sys.executable, "-m", "gemma_doctor", "check", "acme/tiny-lora", "--format", "json",
                            "--gpu", "none", "--with", "peft==0.17.1", "--with", "transformers==4.57.6"],
                           capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1, r.stderr
    m = json.loads(r.stdout)["models"][0]
    assert (m["kind"], m["source"], m["adapter"]["rank"]) == ("adapter", "hub", 4)
    assert m["base"]["found"] == "folder"  # base_model_name_or_path is the folder it was trained from, here
    assert {f["code"] for f in m["findings"]} == {"GD751", "GD752"}
    assert not cache.exists() or not any(cache.rglob("*.safetensors"))


def test_the_head_comparison_reads_bounded_chunks_and_agrees_with_numpy(made, monkeypatch):
    from safetensors.numpy import load_file

    from gemma_doctor.readers import adapter as adapter_reader
    from gemma_doctor.readers.safetensors_header import read_header

    file = made["merged"] / "model.safetensors"
    tensors = load_file(file)
    want = float(abs(tensors["lm_head.weight"].astype("float32") - tensors["model.embed_tokens.weight"]).max())
    header = read_header(file)
    whole = adapter_reader.compare_head((header,))
    monkeypatch.setattr(adapter_reader, "_CHUNK_ELEMENTS", 7)  # many chunks, the last one short
    chunked = adapter_reader.compare_head((header,))
    assert whole.max_abs_diff == chunked.max_abs_diff == want > 0 and not whole.identical


def test_every_kind_is_in_the_json_schema():
    from gemma_doctor.readers.adapter import Kind

    schema = json.loads((Path(__file__).parent.parent / "docs" / "schema" / "check.schema.json").read_text())
    assert set(schema["$defs"]["model"]["properties"]["kind"]["enum"]) == {k.value for k in Kind}


@pytest.mark.parametrize("name", ["mts", "mm", "checkpoint", "merged"])
def test_the_json_of_each_kind_validates_against_the_schema(cli, made, tmp_path, name):
    import jsonschema

    schema = json.loads((Path(__file__).parent.parent / "docs" / "schema" / "check.schema.json").read_text())
    r = cli("check", str(made[name]), "--format", "json", "--gpu", "none", "--cache-dir", str(tmp_path / "hub"))
    jsonschema.validate(r.json(), schema, cls=jsonschema.Draft202012Validator)


# --- recommend on an adapter: the plan is its base's ------------------------------------------------------------

def test_recommend_on_an_adapter_plans_a_lora_run_on_its_base(cli, made, tmp_path):
    r = cli("recommend", str(made["plain"]), "--gpu", "A100", "--format", "json", "--cache-dir", str(tmp_path / "hub"))
    assert r.code == 0, r
    (item,) = r.json()["models"]
    assert item["path"] == str(made["base"]) and item["family"] == "gemma3"
    assert item["prescription"]["method"] == "lora"
    assert f"{made['plain']}: a PEFT adapter; planned on its base {made['base']} as a LoRA run" in r.err
    assert "continuing this one keeps its own (r=4, targets " in r.err
    # --method still decides.
    r = cli("recommend", str(made["plain"]), "--gpu", "A100", "--format", "json", "--method", "qlora",
            "--cache-dir", str(tmp_path / "hub"))
    assert r.json()["models"][0]["prescription"]["method"] == "qlora" and "as a LoRA run" not in r.err


@pytest.mark.parametrize("base, said", [("", "names no base model"),
                                        ("acme/not-here", "which could not be read")])
def test_recommend_on_an_adapter_whose_base_is_not_here_says_so(cli, made, tmp_path, base, said):
    adapter = _naming(made, tmp_path, base)
    r = cli("recommend", str(adapter), "--gpu", "A100", "--cache-dir", str(tmp_path / "hub"))
    assert r.code == 2 and "Traceback" not in r.err, r
    assert said in r.err and r.err.count("\n") == 1 and r.err.startswith("gemma-doctor: error: ")


@pytest.mark.parametrize("base", ["a" * 5000, "acme/" + "b" * 5000, "acme/x\x1b[31m\nGD000 forged", "a\x00b",
                                  "https://example.invalid/acme/x", "../../x"])
def test_recommend_on_an_adapter_of_a_hostile_base_name_says_so_in_one_short_line(cli, made, tmp_path, base):
    """A base_model_name_or_path that is very long, holds control characters or NUL, or is a URL or a path up: one
    short printable line on stderr (the name shown cut, as check's GD742 shows it), never a 10 kB echo of it."""
    adapter = _naming(made, tmp_path, base)
    r = cli("recommend", str(adapter), "--gpu", "A100", "--cache-dir", str(tmp_path / "hub"))
    assert r.code == 2 and "Traceback" not in r.err, r
    assert r.err.count("\n") == 1 and r.err.startswith("gemma-doctor: error: ")
    assert r.err[:-1].isprintable() and len(r.err) < 1200, r.err[:300]
