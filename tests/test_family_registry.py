"""family.py as a specification: what each config is detected as, where its text model reads its settings, which
spellings --family accepts, and which traits the config's values give away (pure: no files, no libraries)."""

from __future__ import annotations

import pytest

from gemma_doctor.family import FAMILY_TEXT_TYPE, detect, family_from_name, fp16_unsafe_family, known_model_types
from tests.builders import gemma2_config, gemma3_1b_config, gemma3_12b_config, gemma3n_config, llama_config, paligemma2_config


@pytest.mark.parametrize("typed, label", [
    ("Gemma-3", "gemma3"), ("gemma3_text", "gemma3"), ("EmbeddingGemma", "gemma3"), ("PaliGemma 2", "paligemma2"),
    ("paligemma1", "paligemma"), ("RecurrentGemma", "recurrent_gemma"), ("recurrent_gemma", "recurrent_gemma"),
    ("gemma1", "gemma"), ("CodeGemma", "gemma"), ("shieldgemma", "shieldgemma2"), ("gemma3n_text", "gemma3n"),
    ("llama", None), ("", None), ("gemma-3-12b", None),
])
def test_family_spellings(typed, label):
    assert family_from_name(typed) == label


@pytest.mark.parametrize("label, unsafe", [
    ("gemma", False), ("paligemma", False),  # Gemma 1 text models: activations fit fp16
    ("paligemma2", True), ("gemma2", True), ("gemma3", True), ("gemma3n", True), ("gemma4", True),
    (None, True), ("not-a-family", True),  # unknown: the safe assumption is "not fp16"
])
def test_fp16_safety_of_a_family_plan(label, unsafe):
    assert fp16_unsafe_family(label) is unsafe


def test_a_family_plan_assumes_its_text_model_type():
    assert {k: FAMILY_TEXT_TYPE[k] for k in ("gemma", "gemma2", "gemma3", "gemma3n", "paligemma", "paligemma2")} == {
        "gemma": "gemma", "gemma2": "gemma2", "gemma3": "gemma3_text", "gemma3n": "gemma3n_text",
        "paligemma": "gemma", "paligemma2": "gemma2"}
    assert {"gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n", "paligemma"} <= set(known_model_types())


@pytest.mark.parametrize("config, expected", [
    (gemma2_config(), ("gemma2", "gemma2", False, "gemma2", True, True, "Gemma 2")),
    (gemma3_1b_config(), ("gemma3", "gemma3_text", False, "gemma3_text", True, True, "Gemma 3")),
    (gemma3_12b_config(), ("gemma3", "gemma3", True, "gemma3_text", True, True, "Gemma 3")),
    (gemma3n_config(), ("gemma3n", "gemma3n", True, "gemma3n_text", False, True, "Gemma 3n")),
    (paligemma2_config(), ("paligemma2", "paligemma", True, "gemma2", True, True, "PaliGemma 2")),
    ({"model_type": "paligemma", "text_config": {}}, ("paligemma", "paligemma", True, "gemma", False, False, "PaliGemma 1")),
    ({"model_type": "gemma"}, ("gemma", "gemma", False, "gemma", False, False, "Gemma 1")),
    (llama_config(), (None, "llama", False, None, False, False, "this model")),
])
def test_detection_says_family_nesting_text_model_hybridcache_and_fp16(config, expected):
    f = detect(config)
    assert (f.label, f.model_type, f.nested, f.text_model_type, f.builds_hybrid_cache, f.fp16_unsafe,
            f.display_name) == expected
    assert f.is_gemma is (expected[0] is not None)


@pytest.mark.parametrize("architectures, model_type", [
    (["Gemma3ForConditionalGeneration"], "gemma3"),
    (["SomethingElse", "Gemma2ForCausalLM"], "gemma2"),
    (["Gemma3ForCausalLMWithExtras"], None),  # exact class names only, never a prefix
    ("Gemma2ForCausalLM", None),  # not a list
    ([{"name": "Gemma2ForCausalLM"}, ["x"], "Gemma2ForCausalLM"], "gemma2"),  # entries that are not names are skipped
])
def test_a_config_without_model_type_is_matched_on_exact_architecture_names(architectures, model_type):
    assert detect({"architectures": architectures}).model_type == model_type


def test_model_type_wins_over_architectures():
    f = detect({"model_type": "llama", "architectures": ["Gemma2ForCausalLM"]})
    assert not f.is_gemma and f.model_type == "llama"


@pytest.mark.parametrize("text, traits", [
    ({}, {}),
    ({"use_bidirectional_attention": True, "num_kv_shared_layers": 10}, {"bidirectional": True, "kv_shared_layers": 10}),
    # Gemma 4 31B / 26B-A4B write "vision" (bidirectional over image tokens only); a number means nothing.
    ({"use_bidirectional_attention": "vision", "num_kv_shared_layers": 0}, {"bidirectional": "vision"}),
    ({"use_bidirectional_attention": 1, "num_kv_shared_layers": 0}, {}),
    ({"enable_moe_block": True}, {"moe_experts": None}),
    ({"num_experts": 8}, {"moe_experts": 8}),
    ({"num_experts": 1}, {}),
    ({"hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262144}, {"per_layer_embeddings": True}),
    ({"hidden_size_per_layer_input": 256}, {}),
    ({"head_dim": 256, "global_head_dim": 512}, {"max_head_dim": 512}),
    ({"head_dim": 128, "per_layer_config": [{"head_dim": 512}, {"head_dim": None}, "x"]}, {"max_head_dim": 512}),
    ({"per_layer_config": {"0": {"head_dim": 64}, "1": {"head_dim": 32}}}, {"max_head_dim": 64}),
    ({"attn_logit_softcapping": 50.0}, {"attn_logit_softcapping": 50.0}),
    ({"attn_logit_softcapping": True}, {}),
    ({"attn_logit_softcapping": None}, {}),
])
def test_traits_come_from_the_text_config_values(text, traits):
    flat = detect({"model_type": "gemma3_text", **text})
    nested = detect({"model_type": "gemma3", "text_config": text})
    assert dict(flat.traits) == traits and dict(nested.traits) == traits
    for name, value in traits.items():
        assert flat.trait(name) == value
    assert flat.trait("no-such-trait") is None
