"""The Gemma family as data: every Gemma-family model_type the installed transformers knows is classified, an unknown
one is said to be unknown (never guessed from a name), and a whole cache of tiny real checkpoints of every member,
saved by the installed transformers, is checked, fixed and restored member by member."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gemma_doctor import family
from gemma_doctor.family import FAMILY_NAMES, MEMBERS, detect, member
from tests.builders import HubCache, tree_state

transformers = pytest.importorskip("transformers")
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES  # noqa: E402

SCHEMA = Path(__file__).resolve().parent.parent / "docs" / "schema" / "check.schema.json"
RESEARCH_12B = {  # google/gemma-4-12B config.json (model_type gemma4_unified) as published, trimmed to what is read
    "architectures": ["Gemma4UnifiedForConditionalGeneration"], "model_type": "gemma4_unified", "dtype": "bfloat16",
    "text_config": {"model_type": "gemma4_unified_text", "hidden_size": 3840, "num_hidden_layers": 48,
                    "head_dim": 256, "global_head_dim": 512, "num_kv_shared_layers": 0,
                    "hidden_size_per_layer_input": 0, "attention_k_eq_v": True, "use_cache": True},
}


def _gemma_types_of_installed_transformers() -> list[str]:
    return sorted(t for t in CONFIG_MAPPING_NAMES if "gemma" in t.lower())


def test_every_gemma_model_type_the_installed_transformers_knows_is_classified():
    """When transformers adds a Gemma, this fails until family.py has a row for it (no network: the registry)."""
    missing = [t for t in _gemma_types_of_installed_transformers() if member(t) is None]
    assert missing == [], f"add Member rows to gemma_doctor/family.py for {missing}"
    assert len(_gemma_types_of_installed_transformers()) >= 32  # 5.23.0 has 32


@pytest.mark.parametrize("m", MEMBERS, ids=lambda m: m.model_type)
def test_each_member_row_agrees_with_the_installed_transformers(m):
    from packaging.version import Version

    config_class = getattr(transformers, CONFIG_MAPPING_NAMES[m.model_type])
    for arch in m.architectures:
        assert hasattr(transformers, arch), arch
    if m.text_path:
        # the text config sits where the row says: a declared sub-config of the class
        assert m.text_path[0] in getattr(config_class, "sub_configs", {}), (m.model_type, m.text_path)
        assert m.text_type in CONFIG_MAPPING_NAMES
    assert Version(m.min_transformers) <= Version(transformers.__version__)
    assert m.family in FAMILY_NAMES


def test_the_json_schema_lists_every_family_label():
    schema = json.loads(SCHEMA.read_text())
    enum = schema["$defs"]["model"]["properties"]["family"]["enum"]
    assert set(enum) - {None} == set(FAMILY_NAMES)


@pytest.mark.parametrize("per_layer", [False, True], ids=["hub-global_head_dim", "saved-by-5.23-per_layer_config"])
def test_the_global_head_width_is_read_from_both_spellings(per_layer):
    text = {"model_type": "gemma4_text", "head_dim": 256, "num_kv_shared_layers": 20,
            "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262144}
    text.update({"per_layer_config": {"4": {"head_dim": 512}, "9": {"head_dim": 512}}} if per_layer
                else {"global_head_dim": 512})
    info = detect({"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": text})
    assert (info.family, info.text_model_type, info.nested) == ("gemma4", "gemma4_text", True)
    assert (info.trait("max_head_dim"), info.trait("kv_shared_layers"), info.trait("per_layer_embeddings")) == (512, 20, True)


def test_a_gemma4_config_is_never_read_as_gemma_1_and_is_not_fp16_safe():
    info = detect({"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"]})
    assert (info.family, info.display_name, info.fp16_unsafe) == ("gemma4", "Gemma 4", True)
    # no model_type: exact class names only
    assert detect({"architectures": ["Gemma4ForConditionalGeneration"]}).family == "gemma4"
    assert detect({"architectures": ["Gemma7ForCausalLM"]}).is_gemma is False
    unified = detect(RESEARCH_12B)
    assert (unified.family, unified.text_model_type, unified.trait("attention_k_eq_v"), unified.trait("max_head_dim")) == (
        "gemma4", "gemma4_unified_text", True, 512)


@pytest.mark.parametrize("config", [
    {"model_type": "gemma9", "architectures": ["GemmaForCausalLM"]},
    {"model_type": "gemma4_turbo", "architectures": ["Gemma4ForConditionalGeneration"]},
], ids=["gemma9-with-a-gemma-1-class", "gemma4_turbo"])
def test_an_unknown_gemma_model_type_is_said_to_be_unknown_not_guessed(hub, cli, config):
    hub.add("org/future", {"config.json": config})
    hub.add("org/llama", {"config.json": {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}})
    doc = cli("check", "--cache-dir", hub.root, "--gpu", "T4", "--format", "json").json()
    [model] = doc["models"]  # kept by the whole-cache scan; the llama is skipped
    assert model["repo_id"] == "org/future" and model["family"] is None
    [finding] = model["findings"]
    assert (finding["code"], finding["severity"], finding["key"]) == ("GD007", "warning", "model_type")
    assert config["model_type"] in finding["message"]
    assert model.get("recommendation") is None  # no precision advice guessed for a model it does not know
    assert [s["target"] for s in doc["skipped"]] == ["org/llama"]


# --- a whole cache of tiny real checkpoints, one per member, saved by the installed transformers -------------------

HYBRID_CACHE_MEMBERS = {"gemma2", "gemma3", "gemma3_text", "paligemma", "shieldgemma2"}  # text model gemma2/gemma3_text


@pytest.fixture(scope="session")
def member_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Every member saved once per session (about 10 s of CPU)."""
    from tests.tiny_family import save_all

    return save_all(tmp_path_factory.mktemp("members"))


@pytest.fixture
def member_cache(tmp_path, member_checkpoints) -> HubCache:
    hub = HubCache(tmp_path / "hub")
    for model_type, folder in member_checkpoints.items():
        hub.add(f"tiny/{model_type}", {f.name: f.read_bytes() for f in folder.iterdir()})
    return hub


def test_the_tiny_checkpoints_cover_every_member_that_is_a_model():
    from tests.tiny_family import SPECS

    assert set(SPECS) == {m.model_type for m in MEMBERS if m.role != "component"}


def test_a_whole_cache_of_every_member_reports_each_with_its_family(member_cache, cli):
    doc = cli("check", "--cache-dir", member_cache.root, "--gpu", "T4", "--format", "json").json()
    assert doc["skipped"] == []
    by_repo = {m["repo_id"].split("/")[1]: m for m in doc["models"]}
    assert set(by_repo) == {m.model_type for m in MEMBERS if m.role != "component"}
    for model_type, m in by_repo.items():
        codes = {f["code"] for f in m["findings"]}
        assert m["family"] == (member(model_type).family if model_type != "paligemma" else "paligemma2"), model_type
        assert "GD003" not in codes and "GD007" not in codes, (model_type, codes)
        # the installed 5.23 has no HybridCache crash: no use_cache finding for anyone
        assert not codes & {"GD101", "GD102"}, (model_type, codes)
        precision = m["recommendation"]["precision"]
        if model_type == "gemma":  # Gemma 1 fits fp16 (the tiny PaliGemma has a Gemma 2 text model: PaliGemma 2)
            assert precision == "fp16", model_type
        else:  # every other member overflows fp16: fp32 on a T4, with GD302 saying why
            assert precision == "fp32" and "GD302" in codes, (model_type, precision, codes)


def test_list_and_recommend_name_every_member_with_its_family(member_cache, cli):
    rows = cli("list", "--cache-dir", member_cache.root, "--format", "json").json()
    rows = rows["models"]
    families = {r["repo_id"].split("/")[1]: r["family"] for r in rows}
    assert families == {t: ("paligemma2" if t == "paligemma" else member(t).family) for t in families}
    assert len(families) == len([m for m in MEMBERS if m.role != "component"])
    assert {r["status"] for r in rows} == {"ok"}
    doc = cli("recommend", "--cache-dir", member_cache.root, "--gpu", "A100", "--format", "json").json()
    assert {m["family"] for m in doc["models"]} == set(families.values())
    assert {(m["recommendation"] or m["nearest"])["precision"] for m in doc["models"]} == {"bf16"}
    # the members without a prescription on an A100 are those check flags whatever the run (GD110: timm missing)
    assert {b.split(":")[0] for m in doc["models"] if m["prescription"] is None for b in m["blocking"]} <= {"GD110"}


def test_fix_and_restore_touch_only_the_members_that_need_a_fix(member_cache, cli):
    before = tree_state(member_cache.root)
    # the installed transformers (5.23) has no HybridCache crash: nothing is rewritten anywhere
    assert cli("fix", "--cache-dir", member_cache.root, "--inplace").code == 0
    assert tree_state(member_cache.root) == before
    r = cli("fix", "--cache-dir", member_cache.root, "--with", "transformers==4.50.3", "--inplace", "--format", "json")
    assert r.code == 0, r
    changed = {m["repo_id"].split("/")[1] for m in r.json()["models"] if m["status"] == "would-change" or m.get("changes")}
    after = tree_state(member_cache.root)
    touched = {k.split("/")[0].removeprefix("models--tiny--") for k in set(before) | set(after)
               if before.get(k) != after.get(k)}
    assert touched == HYBRID_CACHE_MEMBERS, (touched, changed)
    assert cli("restore", "--cache-dir", member_cache.root).code == 0
    restored = {k: v for k, v in tree_state(member_cache.root).items() if "/.gemma-doctor" not in k}
    assert restored == before


def test_every_family_a_plan_can_name_has_a_published_checkpoint_id():
    """recommend --family FAMILY names a real repo in its snippets, never an invented google/<label>."""
    from gemma_doctor.plan.advice import PLAN_MODEL_IDS

    assert set(FAMILY_NAMES) <= set(PLAN_MODEL_IDS)


def test_kv_sharing_is_read_from_configs_as_transformers_saves_them(member_cache, cli, tmp_path):
    """The tiny checkpoints' configs come from save_pretrained (per_layer_config, no global_head_dim): the E-series
    model and both assistants (every layer shared) are KV-shared, the unified 12B-like model is not."""
    train = tmp_path / "train.yaml"
    train.write_text("bf16: true\ngradient_checkpointing: true\ngradient_checkpointing_kwargs:\n  use_reentrant: true\n")
    doc = cli("check", "--cache-dir", member_cache.root, "--gpu", "A100", "--training-config", train,
              "--format", "json").json()
    flagged = {m["repo_id"].split("/")[1] for m in doc["models"] if any(f["code"] == "GD130" for f in m["findings"])}
    assert flagged == {"gemma4", "gemma4_text", "gemma4_assistant", "gemma4_unified_assistant"}


@pytest.mark.parametrize("version", ["4.57.6", "5.5.1", "5.23.0"])
def test_every_members_prescription_passes_its_own_check_or_says_the_way_out(member_checkpoints, tmp_path, cli, version):
    """Issue 20's property on a tiny real checkpoint of every member (saved by transformers 5.23): recommend's YAML
    passes check --training-config with the same GPU and stack, or there is no prescription and a way out."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import prescription_grid as grid

    sys.path.pop(0)

    def run(*args: str) -> tuple[int, str, str]:
        r = cli(*args)
        return r.code, r.out, r.err

    bad, kinds = [], []
    for model_type, folder in member_checkpoints.items():
        for gpu in ("T4", "A100"):
            for task in ("sft", "dpo"):
                o = grid.judge_point(run, grid.Point((str(folder),), (str(folder),), gpu, version, task), tmp_path)
                kinds.append(o.kind)
                if o.kind == "violation":
                    bad.append(f"{model_type} {gpu} {task}: {o.detail}")
    assert not bad, "\n".join(bad)
    assert "prescribed" in kinds  # not an empty promise: tiny members fit anywhere unless a window bites


def test_every_size_recommend_plans_names_the_checkpoint_the_hub_publishes():
    """`recommend --family gemma4 --size e4b` named google/gemma4-e4b-it, a repo that does not exist."""
    from gemma_doctor.family import published_id
    from gemma_doctor.plan.memory import PUBLISHED

    ids = {(f, s): published_id(f, s) for f, sizes in PUBLISHED.items() for s in sizes}
    assert None not in ids.values(), ids
    assert ids[("gemma4", "e4b")] == "google/gemma-4-E4B-it" and ids[("gemma4", "26b-a4b")] == "google/gemma-4-26B-A4B-it"
    assert ids[("gemma3", "12b")] == "google/gemma-3-12b-it" and ids[("gemma", "7b")] == "google/gemma-7b"


def test_recommend_for_a_family_and_size_names_the_real_repo(cli):
    r = cli("recommend", "--family", "gemma4", "--size", "E4B", "--gpu", "H100", "--format", "python")
    assert "google/gemma-4-E4B-it" in r.out and "gemma4-e4b" not in r.out.lower().replace("gemma-4-e4b", "")


@pytest.mark.parametrize("tf, expected", [("4.52.4", "error"), ("4.53.0", None), ("4.53.3", None), ("4.56.1", None),
                                          ("5.5.0", None)])
def test_t5gemma_loads_from_4_53_whatever_its_decoder_s_model_type(hub, cli, tf, expected):
    """GD108 was an error on every 4.53-5.5: the decoder's t5_gemma_module is registered only from 5.6.0, but
    T5GemmaConfig builds it itself (4.53.3 wheel: `decoder = T5GemmaModuleConfig(**decoder)`)."""
    from transformers import T5GemmaConfig

    module = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 1000}
    config = T5GemmaConfig(encoder=dict(module), decoder=dict(module)).to_dict()
    assert config["decoder"]["model_type"] == "t5_gemma_module"  # as the real library saves it
    hub.add("google/t5gemma-tiny", {"config.json": config})
    r = cli("check", "google/t5gemma-tiny", "--cache-dir", hub.root, "--with", f"transformers=={tf}", "--format", "json",
            "--fail-on", "never")
    got = [f["severity"] for f in r.json()["models"][0]["findings"] if f["code"] == "GD108"]
    assert got == ([expected] if expected else [])


@pytest.mark.parametrize("size", [None, "300m"])
def test_recommend_family_embeddinggemma_says_it_cannot_plan_it_instead_of_planning_gemma_3_1b(cli, size):
    """`recommend --family embeddinggemma` planned google/gemma-3-1b-it (the alias was gemma3), and --size 300m
    answered with Gemma 3's sizes: EmbeddingGemma is its own 300M embedding model."""
    r = cli("recommend", "--family", "embeddinggemma", *(("--size", size) if size else ()), "--gpu", "A100")
    assert r.code == 2 and not r.out and len(r.err.strip().splitlines()) == 1, r
    assert "google/embeddinggemma-300m" in r.err and "gemma-3-1b" not in r.err and "1b, 4b" not in r.err, r.err


def test_recommend_gemma3n_and_paligemma2_sizes_are_the_published_ones_not_none(cli):
    """`recommend --family gemma3n --size e4b` said it knew gemma3n's published sizes 'as none'."""
    r = cli("recommend", "--family", "gemma3n", "--size", "e4b", "--gpu", "A100")
    assert r.code == 2 and "google/gemma-3n-E4B-it" in r.err and "none" not in r.err, r.err
    r = cli("recommend", "--family", "gemma3n", "--size", "e8b", "--gpu", "A100")
    assert r.code == 2 and "as e2b, e4b" in r.err, r.err
    r = cli("recommend", "--family", "paligemma2", "--size", "10b", "--gpu", "A100")
    assert r.code == 2 and "google/paligemma2-10b-pt-224" in r.err and "none" not in r.err, r.err
    r = cli("recommend", "--family", "paligemma2", "--size", "9b", "--gpu", "A100")
    assert r.code == 2 and "as 3b, 10b, 28b" in r.err, r.err


@pytest.mark.parametrize("family, checkpoint", [("gemma3n", "google/gemma-3n-E2B-it"),
                                                ("paligemma2", "google/paligemma2-3b-pt-224"),
                                                ("paligemma", "google/paligemma-3b-pt-224"),
                                                ("t5gemma", "google/t5gemma-2b-2b-prefixlm-it")])
def test_recommend_family_without_a_published_config_says_so_instead_of_planning_a_made_up_shape(cli, family,
                                                                                                   checkpoint):
    """`recommend --family gemma3n` (no --size) planned the default shape of memory.shape_from_config (hidden 2048, 18
    layers) under the name of google/gemma-3n-E2B-it: a memory figure of no published model. Where gemma-doctor holds
    no published config of the family, it says so in one line and names the checkpoint to download, as --size does."""
    r = cli("recommend", "--family", family, "--gpu", "A100", "--format", "json")
    assert r.code == 2 and not r.out and len(r.err.strip().splitlines()) == 1, r
    assert "unverified" in r.err and f"gemma-doctor recommend {checkpoint}" in r.err, r.err
