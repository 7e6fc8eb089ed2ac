"""Training-config pitfalls of the attention backend, packing and the logits (GD64x, GD65x): Gemma 2's softcapping
under SDPA, FlashAttention-2's head_dim > 192 backward, packed sequences that attend to each other, and the fp32
logits of Gemma's 256k-262k vocabulary. Measured in docs/findings.md."""

from __future__ import annotations

from typing import Any, Iterator

from gemma_doctor.codes import emits
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.report import Finding, Severity
from gemma_doctor.rules.common import (PACKING_SAFE, executed, exposure_any, located, run_trainer, text_config, text_key,
                                        written_of)
from gemma_doctor.rules.training import setting_finding
from gemma_doctor.run import ASSUMED_TRAINER
from gemma_doctor.stack import Exposure, Window
from gemma_doctor.traits import PAIRED_TASKS, decoder_config, logits_bytes_per_logit, positive_int, positive_number
from gemma_doctor.trainers import CHUNKING_LOOPS, Trainer
from gemma_doctor.units import gib
from gemma_doctor.versioning import (GEMMA2_SDPA_DEFAULT, PACKED_MASK_MISSING, SDPA_SOFTCAP_RAISES,
                                     TRL_PACKING_NO_POSITION_IDS, parse)

# flash-attn applies softcapping in the forward pass from 2.6.0 (transformers gates it with
# is_flash_attn_greater_or_equal("2.6.0")), but the backward kernel learnt it only in 2.6.2: read in the PyPI sdists,
# 2.6.0.post1's and 2.6.1's csrc/flash_attn/src/flash_bwd_kernel.h have no Is_softcap and no dtanh term, 2.6.2's
# has both (`if constexpr (Is_softcap) { scaled_ds *= dtanh(mi, ni); }`). Training needs the backward.
FLASH_ATTN_SOFTCAP = Window("flash-attn", "<2.6.0", "2.6.0")
FLASH_ATTN_SOFTCAP_BACKWARD = Window("flash-attn", "<2.6.2", "2.6.2")
# flash-attn 2.0.0-2.5.4 refuse the backward of head_dim > 192 outside sm80/sm90 (A100/H100) (flash_api.cpp).
FLASH_ATTN_HDIM_BACKWARD = Window("flash-attn", "<2.5.5", "2.5.5")
HDIM_LIMIT = 192
# The fp32 copy of the logits at which the warning is worth a line: 2 GiB, a third of a 24 GB card after weights.
LOGITS_WARN_BYTES = 2 * 1024**3
GEMMA_VOCAB = 262_144  # Gemma 3's vocabulary when config.json does not say


@emits("GD640", "GD641", "GD645", "GD650", "GD683", "GD684")
def check(model: ModelFacts, env: Environment, options: CheckOptions) -> Iterator[Finding]:
    """GD640, GD641, GD645, GD650 from the training config (or what is assumed without one) and the libraries."""
    if not model.family.is_gemma or not model.config.ok:
        return
    tc = env.training_config
    if tc is not None and not tc.ok:
        return
    # The backend as the config names it (the Run's written attention: axolotl's switches, fa3, a kernels-hub name),
    # and the setting that names it.
    written = written_of(model, env)
    backend, key = written.backend, written.attention_setting
    yield from _softcap(model, env, tc, backend, key)
    if tc is None:
        return
    yield from _fa2_head_dim(model, env, tc, backend, key)
    yield from _fa2_device_and_dtype(model, env, tc, backend, key)
    yield from _packing(model, env, tc, backend, key)
    yield from _logits(model, env, tc)


def _softcap(model: ModelFacts, env: Environment, tc: Any, backend: str | None, key: str | None) -> Iterator[Finding]:
    text = text_config(model)
    cap = text.get("attn_logit_softcapping")
    # Gemma 3 has no attention softcapping (null): SDPA is fine there and is never flagged.
    if model.family.text_model_type != "gemma2" or not isinstance(cap, (int, float)) or isinstance(cap, bool):
        return
    stack = env.libraries
    tf = stack.get("transformers")
    capkey = text_key(model, "attn_logit_softcapping")
    fix = ('train Gemma 2 with attn_implementation="eager" (or flash_attention_2 with flash-attn >= '
           f'{FLASH_ATTN_SOFTCAP_BACKWARD.first_fixed})')
    if backend == "sdpa":
        raises = stack.exposure(SDPA_SOFTCAP_RAISES)
        what = ("refuses it: from_pretrained raises \"ValueError: ... does not support an attention implementation "
                "through torch.nn.functional.scaled_dot_product_attention\"" if raises is Exposure.AFFECTED else
                "ignores it: attention runs without softcapping, silently from 4.57.0 (earlier releases warn in "
                "training only), and the logits differ from eager's by as much as their own size"
                if raises is Exposure.SAFE else
                "ignores it silently (before 5.21.0) or refuses to load (5.21.0 and later)")
        yield setting_finding("GD640", Severity.ERROR,
                              f"attn_implementation sdpa on Gemma 2, whose {capkey} is {cap}: {tf.describe()} {what}",
                              fix, tc, key if key in ("attn_implementation", "sdp_attention") else None,
                              transformers=tf.to_json(), attn_logit_softcapping=cap)
        return
    if backend == "flash_attention_2":
        fa = stack.get("flash-attn")
        if stack.exposure(FLASH_ATTN_SOFTCAP_BACKWARD) is Exposure.AFFECTED:
            what = (f"flash-attn applies {capkey} ({cap}) only from 2.6.0, so attention runs without it"
                    if stack.exposure(FLASH_ATTN_SOFTCAP) is Exposure.AFFECTED else
                    f"flash-attn 2.6.0-2.6.1 apply {capkey} ({cap}) in the forward pass only: their backward kernel "
                    "has no softcapping term (flash_bwd_kernel.h gained it in 2.6.2), so the gradients are those of "
                    "uncapped attention")
            yield setting_finding("GD640", Severity.WARNING, f"flash_attention_2 on Gemma 2 with {fa.describe()}: {what}",
                                  f'pip install "flash-attn>={FLASH_ATTN_SOFTCAP_BACKWARD.first_fixed}", or '
                                  'attn_implementation="eager"', tc, "attn_implementation", flash_attn=fa.to_json())
        return
    if backend is not None:
        return
    exposure = exposure_any(stack, GEMMA2_SDPA_DEFAULT)
    sev = {Exposure.AFFECTED: Severity.WARNING, Exposure.UNKNOWN: Severity.INFO}.get(exposure)
    if sev is None:
        return
    assumed = "the training config does not set attn_implementation" if tc is not None else \
        "assumed: attn_implementation is not set (no --training-config)"
    yield Finding("GD640", sev,
                  f"{assumed}, and Gemma 2's default backend is sdpa in transformers 4.42-4.44 and 4.48-5.20 "
                  f"({tf.describe()}): SDPA drops {capkey} ({cap}) without a word",
                  file=tc.path if tc is not None else "config.json", key=None if tc is not None else capkey, fix=fix,
                  details={"exposure": exposure.value, "transformers": tf.to_json(), "assumed_backend": "default"})


def _fa2_head_dim(model: ModelFacts, env: Environment, tc: Any, backend: str | None, key: str | None) -> Iterator[Finding]:
    head_dim = model.family.trait("max_head_dim")
    if backend != "flash_attention_2" or not isinstance(head_dim, int) or head_dim <= HDIM_LIMIT:
        return
    stack = env.libraries
    fa = stack.get("flash-attn")
    exposure = stack.exposure(FLASH_ATTN_HDIM_BACKWARD)
    if exposure is Exposure.SAFE:
        return
    gpu = env.gpu
    device = gpu.weakest if gpu is not None and gpu.backend == "cuda" else None
    cc = device.compute_capability if device is not None else None
    if cc is not None and (tuple(cc) in ((8, 0), (9, 0)) or tuple(cc) < FLASH_MIN_CAPABILITY):
        return  # before Ampere flash-attn 2 runs no backward at all: GD683
    sev = Severity.ERROR if exposure is Exposure.AFFECTED and cc is not None else Severity.WARNING
    where = f"{gpu.label} (compute capability {cc[0]}.{cc[1]})" if cc is not None else "a GPU other than A100/H100"
    yield setting_finding(
        "GD641", sev,
        f"flash_attention_2 with head_dim {head_dim} on {where}: {fa.describe()} "
        + ("raises" if exposure is Exposure.AFFECTED else "may be older than 2.5.5, which raises")
        + " \"FlashAttention backward for head dim > 192 requires A100/A800 or H100/H800\" at the first backward",
        'pip install "flash-attn>=2.5.5" (no dropout), or attn_implementation="sdpa" (Gemma 3) / "eager" (Gemma 2)',
        tc, "attn_implementation", head_dim=head_dim, flash_attn=fa.to_json())


# flash-attn 2.x's flash_api.cpp (mha_fwd / mha_varlen_fwd, read in the 2.6.0.post1-2.6.3 sdists):
# TORCH_CHECK(is_sm90 || is_sm8x, "FlashAttention only supports Ampere GPUs or newer.") and
# TORCH_CHECK(q_dtype == torch::kFloat16 || q_dtype == torch::kBFloat16, "FlashAttention only support fp16 and bf16
# data type"). transformers' integrations/flash_attention.py (5.23.0) casts fp32 queries to the autocast dtype, else
# to the dtype of the model's Linear weights: float32 when the model loads in fp32 without mixed precision.
FLASH_MIN_CAPABILITY = (8, 0)


def _fa2_device_and_dtype(model: ModelFacts, env: Environment, tc: Any, backend: str | None,
                          key: str | None) -> Iterator[Finding]:
    """GD683: FlashAttention-2 on a GPU before Ampere (T4, V100); GD684: FlashAttention-2 on fp32 weights without
    mixed precision. flash-attn refuses both at the first forward."""
    if backend != "flash_attention_2":
        return
    setting = key or "flash_attention"
    gpu = env.gpu
    device = gpu.weakest if gpu is not None and gpu.backend == "cuda" else None
    cc = device.compute_capability if device is not None else None
    if cc is not None and tuple(cc) < FLASH_MIN_CAPABILITY:
        yield setting_finding(
            "GD683", Severity.ERROR,
            f"FlashAttention-2 on {gpu.label}: flash-attn 2 runs only on Ampere "
            "or newer (8.0+) and stops at the first forward with \"FlashAttention only supports Ampere GPUs or "
            "newer.\" (flash_api.cpp)",
            _other_backend(model, env, setting, "sdpa (Gemma 3 and later) or eager (Gemma 2)")
            + ", or a GPU of compute capability 8.0+", tc, setting, compute_capability=list(cc))
    # The run's autocast (the config's switches, or its trainer's default: TRL's configs turn bf16 on where fp16 is
    # off), from which transformers casts the fp32 queries before flash-attn sees them.
    run = model.run
    if run is None or run.precision.value in ("fp16", "bf16") and executed(run.precision):
        return
    # The Run's load dtype, the one the memory plan counts: a config key, or the trainer's default where it names
    # none (TRL: float32; a plain Trainer's from_pretrained: float32 before transformers 5, the checkpoint's from 5.0;
    # axolotl: the torch_dtype its bf16 / fp16 switches make; LLaMA-Factory: float32 for a full fine-tuning).
    # Only a load the run executes is certain; one the plan assumed (the stack's version unknown) is not judged.
    load = run.load_dtype
    if load.value != "float32" or not executed(load):
        return
    dtype = tc.get("torch_dtype") if load.config_key is not None else None
    said = f"{dtype.key}: {dtype.value}" if dtype is not None else f"float32 weights ({load.source})"
    yield setting_finding(
        "GD684", Severity.ERROR,
        f"FlashAttention-2 with {said} and no mixed precision: transformers hands flash-attn the "
        "fp32 queries (no autocast dtype to cast them to), and flash-attn stops with \"FlashAttention only support "
        "fp16 and bf16 data type\"",
        "bf16: true (on a GPU with native bf16), or " + _other_backend(model, env, setting, "sdpa or eager")
        + " for an fp32 run",
        tc, setting, torch_dtype=str(dtype.value) if dtype is not None else "float32")


def _other_backend(model: ModelFacts, env: Environment, setting: str, which: str) -> str:
    """How the config's own format turns FlashAttention-2 into ``which`` ("sdpa or eager"), in the key it is set by:
    axolotl's flash_attention switch, LLaMA-Factory's flash_attn, else attn_implementation (TRL, TrainingArguments)."""
    if setting == "flash_attention":  # axolotl: sdp_attention is its SDPA switch; neither switch is eager
        return "flash_attention: false with sdp_attention: true (sdpa), or neither (eager)"
    key = written_of(model, env).attention.config_key
    if key == "flash_attn":  # LLaMA-Factory: auto | disabled | sdpa | fa2 (disabled is eager)
        return "flash_attn: sdpa, or flash_attn: disabled (eager)"
    return f"{key}: {which}"


def _packing(model: ModelFacts, env: Environment, tc: Any, backend: str | None, key: str | None) -> Iterator[Finding]:
    packing = written_of(model, env).packing  # the Run's: packing / sample_packing / neat_packing, else padding_free
    if packing is None or backend in PACKING_SAFE:
        return
    stack = env.libraries
    tf, trl = stack.get("transformers"), stack.get("trl")
    reasons: list[str] = []
    exposures = [stack.exposure(PACKED_MASK_MISSING)]
    if exposures[0] is not Exposure.SAFE:
        reasons.append(f"{tf.describe()}: eager and sdpa turn reset position_ids into a block-diagonal mask only from "
                       "4.53.1")
    if tc.format.packs_with_trl:  # TRL's SFTTrainer builds the packed batches
        exposures.append(stack.exposure(TRL_PACKING_NO_POSITION_IDS))
        if exposures[-1] is not Exposure.SAFE:
            reasons.append(f"{trl.describe()}: TRL before 0.23 gives a non-flash backend no per-sequence position_ids "
                           "and an all-ones attention_mask")
    if not reasons:
        return
    sev = Severity.ERROR if Exposure.AFFECTED in exposures else Severity.WARNING
    name = backend or "the default backend (eager or sdpa)"
    yield setting_finding(
        "GD645", sev,
        f"{packing.config_key} with {name}: packed sequences attend to each other (cross-contamination), "
        + ("because " if sev is Severity.ERROR else "unless the versions that run are newer: ") + "; ".join(reasons),
        'attn_implementation="flash_attention_2" (or flex_attention), or transformers>=4.53.1 with TRL>=0.23 '
        "(position_ids, no attention_mask, use_cache=False), or turn packing off",
        tc, packing.value, backend=backend)


def _logits(model: ModelFacts, env: Environment, tc: Any) -> Iterator[Finding]:
    run = model.run
    # The micro-batch and sequence length the config sets (the Run's, with the keys they came from); where an option
    # overrides one, the memory plan counts that run's logits and GD80x judges it.
    if run is None or run.batch.config_key is None or run.seq_len.config_key is None:
        return
    batch, seq = run.batch.value, run.seq_len.value
    vocab = text_config(model).get("vocab_size")
    vocab = vocab if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0 else GEMMA_VOCAB
    upcast = batch * seq * vocab * 4
    if upcast < LOGITS_WARN_BYTES:
        return
    stack = env.libraries
    trl = stack.get("trl")
    # The trainer the run executes (trainers.decide, the one decision the memory plan and the rehearsal take).
    trainer = _trainer(model, env)
    chunked = trainer is not None and trainer.chunks_logprobs(stack)
    alive, per_logit, paired = _logits_at_loss(model, batch, seq)
    pairs = " x 2 (chosen and rejected)" if paired else ""
    # The keys as the config's own format writes them (axolotl's micro_batch_size, DeepSpeed's
    # train_micro_batch_size_per_gpu), as every finding that names a key.
    numbers = (f"{run.batch.config_key} {batch}{pairs} x {run.seq_len.config_key} {seq} x vocabulary {vocab:,} logits: "
               f"{gib(upcast * (2 if paired else 1))} in fp32 (the loss upcasts them), {gib(alive)} alive at the loss "
               f"({per_logit:g} bytes per logit: the fp32 log-probabilities, their gradient and the incoming gradient"
               f"{', the soft-capped logits' if per_logit > 12 else ''}; the memory plan's logits component)")
    if chunked:
        yield Finding("GD650", Severity.INFO,
                      f"{numbers}; this does not apply here: {trl.describe()} computes "
                      f"{CHUNKING_LOOPS[trainer][0]} log-probs in chunks (TRL >= 1.15), never "
                      "holding the full logits", fix="nothing to do",
                      **located(run.seq_len, tc, logits_fp32_bytes=upcast, logits_bytes=alive, chunked=True))
        return
    if run.settings.liger_dpo_loss:
        # axolotl's dpo_use_liger_kernel: Liger's fused DPO loss holds one pair's logits at a time (plan/memory.py
        # LIGER_DPO_PAIRS), the plan's logits component
        one, _, _ = _logits_at_loss(model, 1, seq)
        yield Finding("GD650", Severity.INFO,
                      f"{numbers.replace('; the memory plan' + chr(39) + 's logits component', '')}; the batch's "
                      f"logits are never held here: {run.settings.source('liger_dpo_loss')} ({gib(one)} alive at the "
                      "loss: the memory plan's logits component)", fix="nothing to do",
                      **located(run.seq_len, tc, logits_fp32_bytes=upcast, logits_bytes=one, chunked=True))
        return
    trl_v = parse(trl.version)
    if run.memory.verdict == "fits":
        # The memory plan of this very run counts the logits and their copies, and the run fits with margin: a fact.
        yield Finding(
            "GD650", Severity.INFO, numbers + f" per micro-batch; the memory plan counts them and the run fits "
                                              f"({run.memory.summary})",
            fix="nothing to do; a chunked loss (Liger's fused linear cross-entropy, cut-cross-entropy) would free them",
            **located(run.seq_len, tc, logits_fp32_bytes=upcast, logits_bytes=alive, chunked=False))
        return
    if not run.memory.gpu_bytes:
        # No GPU named: nothing limits memory, and the plan of this very run counts them. A warning here rejected every
        # candidate of `recommend --batch-size 4` without a GPU ("no prescription" for a run nothing stops).
        yield Finding(
            "GD650", Severity.INFO, numbers + f" per micro-batch; the memory plan counts them ({run.memory.summary}), and "
                                              "no GPU is named to judge it against",
            fix="nothing to do here; on a GPU, lower the batch and raise gradient_accumulation_steps if the plan does "
                "not fit there (check --gpu NAME)",
            **located(run.seq_len, tc, logits_fp32_bytes=upcast, logits_bytes=alive, chunked=False))
        return
    yield Finding(
        "GD650", Severity.WARNING, numbers + " per micro-batch, on top of weights and activations",
        fix="lower the batch and raise gradient_accumulation_steps, shorten the sequences, or use a chunked loss ("
        # TRL's SFTTrainer chunks them: worth naming where an older TRL or a plain Trainer (trainers.decide) runs it.
        + ("TRL >= 1.15 SFTTrainer, " if trl_v is None or trl_v < parse("1.15.0")
           or trainer is Trainer.TRANSFORMERS else "")
        + "Liger's fused linear cross-entropy, cut-cross-entropy)",
        **located(run.seq_len, tc, logits_fp32_bytes=upcast, logits_bytes=alive, chunked=False))


def _trainer(model: ModelFacts, env: Environment) -> Trainer | None:
    """The trainer the readers decided for the run (the Run's), None where no training config or launch line names one
    (the Run's trainer is then the plan's assumption, not a decision)."""
    chosen = run_trainer(model, env)
    return chosen.value if chosen.source != ASSUMED_TRAINER else None


def _logits_at_loss(model: ModelFacts, batch: int, seq: int) -> tuple[int, float, bool]:
    """(bytes, bytes per logit, paired) of the logits alive at the loss: the memory plan's own formula and run
    (traits.logits_bytes_per_logit; a paired task such as DPO doubles the batch), so GD650 and the plan agree."""
    run = model.run
    if run is not None:
        vocab, softcap, precision, task = (run.shape.vocab, run.shape.final_logit_softcapping, run.precision.value,
                                           run.task)
    else:  # no plan (no shape could be read): the same formula on config.json's text config and the default run (SFT
        # in bf16), as memory.shape_from_config reads them
        text = decoder_config(model.config.data if model.config.ok else {})
        vocab = positive_int(text.get("vocab_size")) or GEMMA_VOCAB
        softcap = positive_number(text.get("final_logit_softcapping"))
        precision, task = "bf16", "sft"
    paired = task in PAIRED_TASKS
    per_logit = logits_bytes_per_logit(softcap, precision)
    return int(batch * (2 if paired else 1) * seq * per_logit * vocab), per_logit, paired
