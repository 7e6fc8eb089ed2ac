"""The trainers a training config is written for, as a registry of kinds, and the one decision of which trainer
executes a run.

Two questions, kept apart:
- **Which format is this file** (``ConfigKind``): a TrainingArguments / TRL config, axolotl's, LLaMA-Factory's,
  accelerate's, DeepSpeed's, or a config of something that trains nothing (vLLM, SGLang, NeMo). One class per kind
  behind one interface, as pip-audit's dependency sources: how the file is recognised, and the facts the rules need
  about how that format's keys are read (who builds packed batches, whether checkpointing is on by default, how LoRA
  targets default...). The rules ask the kind; they never compare its name to a string.
- **Which trainer executes the run** (``Trainer``): a plain transformers Trainer, TRL's SFT / DPO / GRPO trainers,
  axolotl, LLaMA-Factory, or a launcher's script. Decided once (``decide``) from the config and the launch line,
  kept on the training config (``TrainingConfig.trainer``) and on the Run (``run.Run.trainer``); the memory plan
  (chunked or full logits), GD650 and the rehearsal's twin all take that decision (docs/decision.md).

Pure and light: no files, no torch; imported by the training-config reader.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping


class Trainer(str, enum.Enum):
    """The trainer that executes a run."""

    TRANSFORMERS = "transformers"  # a plain transformers Trainer: the user's script reads TrainingArguments
    TRL_SFT = "trl-sft"
    TRL_DPO = "trl-dpo"
    TRL_GRPO = "trl-grpo"
    TRL_RL = "trl-rl"  # another of TRL's preference / RL trainers (ORPO, KTO, PPO...)
    AXOLOTL = "axolotl"
    LLAMA_FACTORY = "llama-factory"
    SCRIPT = "script"  # a launcher's own config (accelerate, DeepSpeed): the script on the launch line decides

    @property
    def runs_trl(self) -> bool:
        """One of TRL's trainers runs the loop (its collators and data preparation apply)."""
        return self.value.startswith("trl-")

    def chunks_logprobs(self, stack: Any) -> bool:
        """The loss never holds the b x s x V logits: TRL's SFTTrainer or DPOTrainer under a TRL that computes their
        log-probs through the fused LM head (every version the stack may run is in versioning.TRL_CHUNKED_LOGPROBS)."""
        if self not in CHUNKING_TRAINERS or stack is None:
            return False
        from gemma_doctor.stack import Exposure
        from gemma_doctor.versioning import TRL_CHUNKED_LOGPROBS

        return stack.exposure(TRL_CHUNKED_LOGPROBS) is Exposure.AFFECTED

    def bf16_by_default(self, stack: Any) -> Any:
        """Whether a config of this trainer that sets no bf16 trains in bf16 (TRL's configs: `bf16 = not fp16`,
        versioning.TRL_BF16_DEFAULT), as a stack.Exposure: AFFECTED, SAFE (TrainingArguments' fp32), or UNKNOWN where
        the stack's TRL version is not known."""
        from gemma_doctor.stack import Exposure
        from gemma_doctor.versioning import TRL_BF16_DEFAULT

        if not self.runs_trl:
            return Exposure.SAFE
        return stack.exposure(TRL_BF16_DEFAULT[self.value]) if stack is not None else Exposure.UNKNOWN

    @property
    def twin(self) -> str | None:
        """The loop the rehearsal's driver runs for this trainer ("trl-sft", "trl-dpo", "trl-grpo", "transformers"), or
        None where it has none of its own (axolotl, LLaMA-Factory, TRL's other RL trainers, a script: the SFT loop the
        keys describe)."""
        return {Trainer.TRL_SFT: "trl-sft", Trainer.TRL_DPO: "trl-dpo", Trainer.TRL_GRPO: "trl-grpo",
                Trainer.TRANSFORMERS: "transformers"}.get(self)


# TRL's trainers that compute per-token log-probs through a fused LM head from TRL 1.15.0 (add_fused_lm_head in
# trl/trainer/sft_trainer.py and dpo_trainer.py of the 1.15.0 and 1.16.0 wheels, absent from 1.14.0's): SFT, and DPO for
# the policy and the reference model alike. Reproduced for DPO with TRL 1.16.0 on a tiny Gemma 3 text model with the
# real vocabulary (docs/memory.md): the largest tensor of a training step is one [tokens x 32,768] tile, never the
# b x s x V logits that the model's own loss builds. GRPO's trainer too from 1.15.0 (_get_per_token_logps_and_entropies
# calls the model with fused_lm_head=True in the 1.15.0 and 1.16.0 wheels' grpo_trainer.py, not in 1.14.0's).
# Not axolotl, for DPO either: axolotl 0.19.0 (the newest release) runs DPO through AxolotlDPOTrainer
# (core/trainers/dpo/trainer.py), a subclass of TRL's DPOTrainer that overrides only _tokenize, training_step and
# push_to_hub, so its log-probs are the TRL's it runs with; and axolotl 0.19.0 requires trl==1.9.0, whose
# DPOTrainer._compute_loss takes `outputs.logits` whole (its fused path is only Liger's, `use_liger_kernel`). It cannot
# run a chunking TRL: with TRL 1.16.0 its DPO config fails to import (`trl.experimental.prm` is gone). Reproduced with
# axolotl 0.19.0, TRL 1.9.0, transformers 5.16.1 on the tiny Gemma 3 of benchmarks/axolotl_dpo_logits.py: the largest
# tensor of a DPO step is the [256 x 262,144] logits, LoRA and full fine-tuning alike (docs/memory.md).
# Each with the loop it names in what is said about it ("computes GRPO log-probs in chunks").
CHUNKING_LOOPS = {Trainer.TRL_SFT: ("SFT", "SFTTrainer"), Trainer.TRL_DPO: ("DPO", "DPOTrainer"),
                  Trainer.TRL_GRPO: ("GRPO", "GRPOTrainer")}
CHUNKING_TRAINERS = frozenset(CHUNKING_LOOPS)


@dataclass(frozen=True)
class Chosen:
    """The trainer that executes the run, where that was decided from, and the SFT loop its keys describe (what a
    rehearsal runs where the trainer's own loop is not rehearsed)."""

    value: Trainer
    source: str
    sft_loop: Trainer = Trainer.TRANSFORMERS
    default: bool = False  # nothing in the input named it: the format's default (a launch line may still name one)


# Keys only TRL's SFTConfig / ModelConfig / ScriptArguments hold (TrainingArguments has none of them, checked against
# transformers 5.23 and TRL 1.16; max_seq_length is older TRL's name of max_length): a
# TrainingArguments / TRL config with one is what `trl sft --config` (or a TrlParser script) reads, so TRL's SFTTrainer
# runs it. LoRA keys (use_peft, lora_r, lora_target_modules: TRL's ModelConfig) are read by both paths: they decide
# nothing.
TRL_SFT_KEYS = ("max_length", "max_seq_length", "packing", "dataset_text_field", "completion_only_loss",
                "assistant_only_loss", "model_name_or_path", "dataset_name", "padding_free", "dataset_kwargs")
# `trl SUBCOMMAND` on a launch line -> the trainer it runs (TRL 1.16 trl/cli/commands/__init__.py's training commands).
TRL_COMMANDS = {"sft": Trainer.TRL_SFT, "dpo": Trainer.TRL_DPO, "grpo": Trainer.TRL_GRPO, "kto": Trainer.TRL_RL,
                "rloo": Trainer.TRL_RL, "reward": Trainer.TRL_RL, "distillation": Trainer.TRL_RL}


# TrainingArguments' per_device_train_batch_size default (transformers 5.23.0, 5.6.0), which TRL's configs keep (SFT /
# DPO / GRPO / KTO / Reward configs of TRL 1.16.0 and 0.24.0): the batch a plain Trainer or TRL trainer runs where the
# config leaves it open (plan/runplan.trainer_defaults, GD663).
TRAINING_ARGUMENTS_BATCH = 8


# Keys that only a TRL DPOConfig has: a TRL JSON/YAML with them is a DPO run even without rl/stage.
DPO_ONLY_KEYS = ("rpo_alpha", "reference_free", "ref_model_init_kwargs", "precompute_ref_log_probs")
# Keys only TRL's GRPOConfig holds (TRL 1.16 trl/trainer/grpo_config.py, against its SFT and DPO configs and
# TrainingArguments): a config with one of them is what `trl grpo --config` reads. Not max_completion_length (older
# DPOConfigs hold it) nor use_vllm (online DPO's too).
GRPO_ONLY_KEYS = ("num_generations", "reward_weights", "scale_rewards", "steps_per_generation",
                  "generation_batch_size", "vllm_mode")
# `beta` is shared by TRL's DPO, CPO, ORPO and KTO configs; with one of DPOConfig's loss types (TRL 0.8-0.2x
# trl/trainer/dpo_config.py; a list of them since 0.20), or with max_prompt_length and no loss_type, it is DPO.
DPO_LOSS_TYPES = frozenset({"sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard",
                            "aot", "aot_pair", "apo_zero", "apo_down", "discopop", "sft"})


def rl_named_by_keys(data: Mapping[str, Any]) -> tuple[str, str] | None:
    """(the key, "dpo" or "grpo") where a TRL config's own keys name its RL trainer without `rl:` / `stage:` (what
    `trl dpo|grpo --config` reads), else None."""
    key = next((k for k in DPO_ONLY_KEYS if k in data), None)
    if key is not None:
        return key, "dpo"
    if _looks_like_dpo(data):
        return "beta", "dpo"
    key = next((k for k in GRPO_ONLY_KEYS if k in data), None)
    return (key, "grpo") if key is not None else None


def _looks_like_dpo(data: Mapping[str, Any]) -> bool:
    """A TRL DPOConfig written as YAML/JSON without `rl:` (what `trl dpo --config` reads): beta with a DPO loss."""
    if "beta" not in data:
        return False
    loss = data.get("loss_type")
    if loss is None:
        return "max_prompt_length" in data
    losses = loss if isinstance(loss, list) else [loss]
    return bool(losses) and all(isinstance(x, str) and x.lower() in DPO_LOSS_TYPES for x in losses)


def sft_key(data: Mapping[str, Any]) -> str | None:
    """The first of TRL_SFT_KEYS at the top level of a config, or None."""
    return next((k for k in TRL_SFT_KEYS if k in data), None)


class ConfigKind:
    """One format of config file: how it is recognised, and what its keys mean to the rules. Subclasses set the
    facts that differ from a TrainingArguments config's."""

    name: ClassVar[str] = "unknown"
    trains: ClassVar[bool] = True  # a training run's config (False: a serving or NeMo config, refused in one line)
    refusal: ClassVar[str] = ""  # why a config of a kind that trains nothing is not read
    # TRL's SFTTrainer builds the packed / padding-free batches (GD645: TRL before 0.23 gives no position_ids).
    packs_with_trl: ClassVar[bool] = False
    # LoRA without target_modules is handed to PEFT as target_modules=None: PEFT's per-model default (GD420).
    lora_targets_peft_default: ClassVar[bool] = False
    # The trainer checkpoints (reentrantly) unless told not to (LLaMA-Factory: disable_gradient_checkpointing,
    # use_reentrant_gc defaults to true, hparams/model_args.py).
    checkpoints_by_default: ClassVar[bool] = False
    # LoRA targets are this trainer's own words: "all" is every linear layer, a string is a comma list, and its regex
    # leaves the vision tower out (LLaMA-Factory's lora_target, freeze_vision_tower): not PEFT's reading.
    own_lora_targets: ClassVar[bool] = False
    # "auto" precision copies TrainingArguments' own value rather than probing the GPU (a DeepSpeed JSON).
    auto_copies_training_arguments: ClassVar[bool] = False
    # FSDP is set up by TrainingArguments (its defaults: transformer-based wrap, FSDP2 from transformers 5.10), not by
    # a launcher's plugin (accelerate's: NO_WRAP without a policy, FSDP1 unless fsdp_version says 2).
    fsdp_by_training_arguments: ClassVar[bool] = True
    # The table of the keys its trainer accepts (readers/<name>.json), where it has one: a key close to one of them but
    # not one is a misspelling (GD680 for TRL / TrainingArguments, whose non-boolean switches are GD681; GD986 for
    # axolotl).
    key_table: ClassVar[str | None] = None
    # The trainer loads the weights in the dtype its precision switches say, never in a library's default: the reader
    # states that dtype where the config names none (axolotl's normalize_config).
    load_dtype_from_precision: ClassVar[bool] = False

    def recognises(self, data: Mapping[str, Any]) -> bool:
        """A parsed config (a mapping) is of this kind."""
        return False

    def decide(self, data: Mapping[str, Any], rl: str | None) -> Chosen | None:
        """The trainer that executes a config of this kind (``rl``: the reader's RL trainer, lower case), or None for
        a kind that trains nothing."""
        loop = Trainer.TRL_SFT if sft_key(data) else Trainer.TRANSFORMERS
        return Chosen(Trainer.SCRIPT, f"{self.name} config (the launched script decides)", loop, default=True)


# Keys only a training config has: a file with one of them is read as one, whatever else it holds.
_TRAINING_ONLY = frozenset({"output_dir", "learning_rate", "per_device_train_batch_size", "num_train_epochs",
                            "base_model", "micro_batch_size", "stage", "finetuning_type", "gradient_accumulation_steps"})
# Files that are configs, but not of a training run gemma-doctor reads: vLLM's `vllm serve --config` (EngineArgs names,
# dashes or underscores), SGLang's server args, NeMo's trainer/model/exp_manager (and NeMo-Automodel's recipes).
# Read as training configs they said "trains in fp32" (GD609): they are recognised and refused in one line instead.
_VLLM_KEYS = frozenset({"tensor_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization", "max_model_len",
                        "served_model_name", "kv_cache_dtype", "enforce_eager", "max_num_seqs", "max_num_batched_tokens",
                        "enable_prefix_caching", "swap_space", "enable_lora", "max_lora_rank", "limit_mm_per_prompt"})
_SGLANG_KEYS = frozenset({"tp_size", "dp_size", "mem_fraction_static",
                          "chunked_prefill_size", "max_running_requests", "schedule_policy"})


def _keys(data: Mapping[str, Any]) -> frozenset[str]:
    return frozenset(k.replace("-", "_") for k in data if isinstance(k, str))


class _NotTraining(ConfigKind):
    trains = False

    def decide(self, data: Mapping[str, Any], rl: str | None) -> Chosen | None:
        return None


class Nemo(_NotTraining):
    """NeMo's trainer / model / exp_manager config (and NeMo-Automodel's recipes)."""

    name = "nemo"
    refusal = ("a NeMo config (trainer / model / exp_manager), which gemma-doctor does not read as a training config; "
               "state the run with --batch-size, --seq-len, --gpu and --num-gpus, or pass a TRL / accelerate config")

    def recognises(self, data: Mapping[str, Any]) -> bool:
        if _keys(data) & _TRAINING_ONLY:
            return False
        trainer = data.get("trainer")
        return bool((isinstance(trainer, dict) and ({"precision", "devices", "num_nodes", "max_steps"} & set(trainer))
                     and (isinstance(data.get("model"), dict) or "exp_manager" in data))
                    or ("step_scheduler" in data and isinstance(data.get("model"), dict)))


class _Serving(_NotTraining):
    """A serving engine's config: one of the engine's own keys and no key only training configs hold."""

    engine_keys: ClassVar[frozenset[str]] = frozenset()

    def recognises(self, data: Mapping[str, Any]) -> bool:
        keys = _keys(data)
        return not keys & _TRAINING_ONLY and bool(keys & self.engine_keys)


class Sglang(_Serving):
    """SGLang's server arguments (python -m sglang.launch_server --config)."""

    name = "sglang"
    engine_keys = frozenset(_SGLANG_KEYS)
    refusal = ("an SGLang server config (python -m sglang.launch_server --config), not a training config; to judge a "
               "served model, name the engine: gemma-doctor check MODEL --with sglang==VERSION")


class Vllm(_Serving):
    """vLLM's engine arguments (vllm serve --config)."""

    name = "vllm"
    engine_keys = frozenset(_VLLM_KEYS)
    refusal = ("a vLLM serving config (vllm serve --config), not a training config; to judge a served model, name the "
               "engine: gemma-doctor check MODEL --with vllm==VERSION")


class Accelerate(ConfigKind):
    """`accelerate config`'s YAML (compute_environment, distributed_type, fsdp_config...)."""

    name = "accelerate"
    fsdp_by_training_arguments = False

    def recognises(self, data: Mapping[str, Any]) -> bool:
        return "compute_environment" in data or "distributed_type" in data


class DeepSpeed(ConfigKind):
    """A DeepSpeed JSON (zero_optimization, train_micro_batch_size_per_gpu)."""

    name = "deepspeed"
    auto_copies_training_arguments = True

    def recognises(self, data: Mapping[str, Any]) -> bool:
        return "zero_optimization" in data or "train_micro_batch_size_per_gpu" in data


class Axolotl(ConfigKind):
    """axolotl's YAML (base_model, micro_batch_size): its own trainer, a transformers Trainer subclass."""

    name = "axolotl"
    # axolotl's schema drops a key it has no field for (pydantic's extra="ignore"): a misspelt key trains with the
    # field's default without a word (axolotl 0.19.0, reproduced), GD986.
    key_table = "axolotl_keys"
    load_dtype_from_precision = True

    def recognises(self, data: Mapping[str, Any]) -> bool:
        return "base_model" in data or "micro_batch_size" in data

    def decide(self, data: Mapping[str, Any], rl: str | None) -> Chosen | None:
        # Its SFT loop is AxolotlTrainer, a transformers Trainer subclass (axolotl/core/trainers/base.py), never TRL's
        # SFTTrainer, whatever TRL-like key the file holds.
        return Chosen(Trainer.AXOLOTL, "axolotl config (base_model / micro_batch_size)", Trainer.TRANSFORMERS)


class LlamaFactory(ConfigKind):
    """LLaMA-Factory's YAML (stage with finetuning_type or template): its own trainers."""

    name = "llama-factory"
    checkpoints_by_default = True
    own_lora_targets = True
    key_table = "llamafactory_keys"  # its five argument classes' fields (parse_dict with allow_extra_keys=False)

    def recognises(self, data: Mapping[str, Any]) -> bool:
        return "stage" in data and ("finetuning_type" in data or "template" in data)

    def decide(self, data: Mapping[str, Any], rl: str | None) -> Chosen | None:
        # Its SFT loop is CustomSeq2SeqTrainer, a transformers Seq2SeqTrainer (llamafactory/train/sft/trainer.py), and
        # `packing` is its own data argument, not TRL's.
        return Chosen(Trainer.LLAMA_FACTORY, "LLaMA-Factory config (stage with finetuning_type / template)",
                      Trainer.TRANSFORMERS)


class TrainingArguments(ConfigKind):
    """A TrainingArguments / TRL config (JSON or YAML of dataclass fields): what `trl sft|dpo|grpo --config` and
    HfArgumentParser scripts read. The fallback: any mapping no other kind recognises."""

    name = "transformers"
    packs_with_trl = True
    lora_targets_peft_default = True
    key_table = "trainer_keys"  # its top-level keys are TrainingArguments / TRL dataclass fields

    def recognises(self, data: Mapping[str, Any]) -> bool:
        return True

    def decide(self, data: Mapping[str, Any], rl: str | None) -> Chosen | None:
        key = sft_key(data)
        loop = Trainer.TRL_SFT if key else Trainer.TRANSFORMERS
        if rl == "dpo":
            return Chosen(Trainer.TRL_DPO, "training config (TRL's DPOConfig)", loop)
        if rl == "grpo":
            return Chosen(Trainer.TRL_GRPO, "training config (TRL's GRPOConfig)", loop)
        if rl is not None:
            return Chosen(Trainer.TRL_RL, f"training config (TRL's {rl.upper()} trainer)", loop)
        if "beta" in data:
            # A key of TRL's preference configs (DPO, CPO, ORPO, KTO), which the reader could not pin to DPO.
            return Chosen(Trainer.TRL_RL, "training config beta (a key of TRL's preference trainers' configs)", loop)
        if key is not None:
            return Chosen(Trainer.TRL_SFT, f"training config {key} (a key of TRL's SFTConfig, not TrainingArguments)",
                          loop)
        # Only TrainingArguments keys: `python train.py` with HfArgumentParser runs a plain Trainer, and nothing in the
        # file says TRL runs it (`trl sft --config` also needs model_name_or_path and a dataset, which it lacks). A
        # launch line that names `trl sft` decides otherwise (readers/launch.py).
        return Chosen(Trainer.TRANSFORMERS, "training config (TrainingArguments keys only: a plain transformers "
                                            "Trainer, unless --launch names TRL)", loop, default=True)


# The registry, in the order a file is recognised: the kinds that train nothing first (a file with a training-only key
# is never one of them), the launchers' configs, the trainers' own formats, TrainingArguments last (the fallback).
REGISTRY: tuple[ConfigKind, ...] = (Nemo(), Sglang(), Vllm(), Accelerate(), DeepSpeed(), Axolotl(), LlamaFactory(),
                                    TrainingArguments())
_BY_NAME: dict[str, ConfigKind] = {k.name: k for k in REGISTRY}
UNKNOWN = ConfigKind()  # the kind of a file that could not be read


def recognise(data: Mapping[str, Any]) -> ConfigKind:
    """The kind of a parsed config: the first of REGISTRY that recognises it."""
    return next(k for k in REGISTRY if k.recognises(data))


def kind_named(name: str) -> ConfigKind:
    """The kind called ``name`` (a TrainingConfig's ``kind``); UNKNOWN for a name no kind has."""
    return _BY_NAME.get(name, UNKNOWN)


def not_training() -> dict[str, str]:
    """Kind name -> why a config of that kind is refused, for every kind that trains nothing."""
    return {k.name: k.refusal for k in REGISTRY if not k.trains}


# The preference / RL tasks a config's trainer names (an `rl` / `stage` value, or TRL's DPO / GRPO keys), by the names
# `--task` takes (plan/recommend.TASKS): check plans the run as that task where --task says none.
NAMED_TASKS = frozenset({"dpo", "orpo", "kto", "grpo", "ppo"})
_TRAINER_TASKS = {Trainer.TRL_DPO: "dpo", Trainer.TRL_GRPO: "grpo"}


def task_named(rl: Any, chosen: Chosen | None) -> str | None:
    """The task (NAMED_TASKS) a config's `rl` / `stage` setting (``rl``: its value) or the trainer that executes it
    names, else None (SFT, pre-training, or a trainer gemma-doctor plans as SFT: ipo, simpo, a reward model...)."""
    named = rl_trainer(rl)
    if named in NAMED_TASKS:
        return named
    return _TRAINER_TASKS.get(chosen.value) if chosen is not None else None


def rl_trainer(value: Any) -> str | None:
    """The RL trainer an `rl` / `stage` setting names, lower case; None for SFT or pre-training (LLaMA-Factory's
    stage: sft / pt) and for no setting."""
    if not isinstance(value, str) or value.strip().lower() in ("sft", "pt", ""):
        return None
    return value.strip().lower()


def decide(kind: ConfigKind, data: Mapping[str, Any], rl: Any) -> Chosen | None:
    """The one decision of which trainer executes a config of ``kind`` holding ``data`` (``rl``: the reader's `rl`
    setting's value)."""
    return kind.decide(data, rl_trainer(rl))


def named_by_launch(words: list[str]) -> Chosen | None:
    """The trainer a launch command names itself (`trl sft ...`, `axolotl train ...`, `llamafactory-cli train ...`), or
    None where the script decides (`python train.py`, `accelerate launch ...`)."""
    head = os.path.basename(words[0]) if words else ""
    sub = words[1] if len(words) > 1 else ""
    if head == "trl" and sub in TRL_COMMANDS:
        return Chosen(TRL_COMMANDS[sub], f"--launch trl {sub}", TRL_COMMANDS[sub] if sub == "sft" else Trainer.TRANSFORMERS)
    if head == "axolotl":
        return Chosen(Trainer.AXOLOTL, f"--launch axolotl {sub}".rstrip())
    if head == "llamafactory-cli":
        return Chosen(Trainer.LLAMA_FACTORY, f"--launch llamafactory-cli {sub}".rstrip())
    return None
