"""Gemma 4 training traps shown with a real tiny Gemma4ForConditionalGeneration (installed transformers, CPU):
reentrant gradient checkpointing on a KV-shared model silently corrupts the producer layers' gradients, and
prepare() makes checkpointing non-reentrant so that the gradients match again."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from packaging.version import Version  # noqa: E402

from gemma_doctor import prepare  # noqa: E402
from tests.tiny_family import G4A, G4IDS, G4TXT, G4V  # noqa: E402

pytestmark = pytest.mark.skipif(Version(transformers.__version__) < Version("5.5.2"),
                                reason="KV sharing through a side channel exists from transformers 5.5.2")
# E-series shape: 6 layers [sliding, full] x 3, the last 2 KV-shared, so layers 2 (sliding) and 3 (full) produce
# the K/V that layers 4 and 5 reuse.
PRODUCERS = (2, 3)


def _model(shared: int = 2) -> torch.nn.Module:
    text = dict(G4TXT, num_hidden_layers=6, layer_types=["sliding_attention", "full_attention"] * 3, hidden_size=64,
                num_attention_heads=4, num_key_value_heads=2, num_kv_shared_layers=shared)
    config = transformers.Gemma4Config(text_config=text, vision_config=G4V, audio_config=G4A, **G4IDS)
    torch.manual_seed(0)
    model = transformers.Gemma4ForConditionalGeneration(config)
    model.train()
    return model


def _step(model: torch.nn.Module) -> tuple[float, dict[str, torch.Tensor]]:
    ids = torch.randint(3, 240, (2, 24), generator=torch.Generator().manual_seed(1))
    out = model(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    return out.loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _producer_k_cosines(ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> list[float]:
    names = [f"model.language_model.layers.{i}.self_attn.k_proj.weight" for i in PRODUCERS]
    return [torch.nn.functional.cosine_similarity(ref[n].flatten(), got[n].flatten(), dim=0).item() for n in names]


@pytest.fixture(scope="module")
def reference() -> tuple[float, dict[str, torch.Tensor]]:
    torch.set_num_threads(1)
    return _step(_model())


def test_reentrant_checkpointing_corrupts_the_producer_gradients_with_the_loss_unchanged(reference):
    ref_loss, ref = reference
    model = _model()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    loss, got = _step(model)
    assert loss == pytest.approx(ref_loss, abs=1e-6)  # nothing in the loss shows it
    assert min(_producer_k_cosines(ref, got)) < 0.95  # measured 0.84-0.88 on transformers 5.23.0


@pytest.mark.parametrize("args_kind", ["dict", "TrainingArguments"])
def test_prepare_makes_checkpointing_non_reentrant_and_the_gradients_match(reference, tmp_path, args_kind):
    _, ref = reference
    model = _model()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    kwargs = {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": True}}
    args = kwargs if args_kind == "dict" else transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                                                             report_to=[], **kwargs)
    prepared = prepare(model, args, on_mismatch="ignore")
    assert prepared.family == "gemma4"
    # the language model's 6 layers and the towers' layers
    assert prepared.guarded[-1] == "model: 8 checkpointed modules use_reentrant=False"
    if args_kind == "dict":
        assert prepared.guarded[:-1] == ("training_args.gradient_checkpointing_kwargs.use_reentrant",)
        assert args["gradient_checkpointing_kwargs"] == {"use_reentrant": False}
    else:  # 5.23's TrainingArguments: gradient_checkpointing_kwargs is a deprecated alias of activation_checkpointing_kwargs
        assert args.gradient_checkpointing_kwargs == {"use_reentrant": False}
        assert getattr(args, "activation_checkpointing_kwargs", {"use_reentrant": False}) == {"use_reentrant": False}
    _, got = _step(model)
    assert min(_producer_k_cosines(ref, got)) > 0.9999
    assert all(torch.allclose(ref[n], got[n], atol=1e-5) for n in ref)


def test_prepare_leaves_checkpointing_alone_without_kv_sharing():
    model = _model(shared=0)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    args = {"gradient_checkpointing_kwargs": {"use_reentrant": True}}
    assert prepare(model, args, on_mismatch="ignore").guarded == ()
    assert args == {"gradient_checkpointing_kwargs": {"use_reentrant": True}}


def test_text_only_prepare_freezes_exactly_the_towers_a_text_batch_leaves_without_gradients(reference):
    _, ref = reference
    model = _model()
    prepared = prepare(model, on_mismatch="ignore", text_only=True)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen and all(any(part in n.split(".") for part in ("vision_tower", "audio_tower", "embed_vision",
                                                                 "embed_audio")) for n in frozen)
    assert {g.split(":")[0] for g in prepared.guarded} == {"vision_tower", "audio_tower", "embed_vision", "embed_audio"}
    _, got = _step(model)
    # every parameter still trained gets a gradient (nothing left for DDP to wait on), and the same one as before
    assert {n for n, p in model.named_parameters() if p.requires_grad} == set(got) == set(ref)
    assert all(torch.allclose(ref[n], got[n]) for n in ref)
    assert prepare(_model(), on_mismatch="ignore").guarded == ()  # not without text_only


def test_the_recommended_lora_snippet_adapts_the_language_model_only():
    """recommend --family gemma4's PEFT snippet runs with the installed PEFT on a real Gemma 4 with towers, where
    plain names fail on Gemma4ClippableLinear (GD440)."""
    peft = pytest.importorskip("peft")
    from gemma_doctor.plan import advice, recommend
    from gemma_doctor.readers.gpu import for_options
    from gemma_doctor.facts import CheckOptions

    gpu = for_options(CheckOptions(gpu="A100"))
    rec = recommend.decide(advice.inputs_for(None, gpu, None, None, None, family="gemma4"))
    snippet = recommend.python_snippets(rec, "google/gemma-4-E2B-it")["peft"]
    line = next(ln for ln in snippet.splitlines() if ln.startswith("lora_config = "))
    scope = {"LoraConfig": peft.LoraConfig}
    exec(line, scope)  # noqa: S102 - the snippet users paste
    model = peft.get_peft_model(_model(), scope["lora_config"])
    adapted = {n.split(".lora_A")[0] for n, _ in model.named_parameters() if ".lora_A" in n}
    assert adapted and all(".language_model." in n for n in adapted)
    with pytest.raises(ValueError, match="Gemma4ClippableLinear"):
        peft.get_peft_model(_model(), peft.LoraConfig(target_modules=["q_proj", "v_proj"]))
