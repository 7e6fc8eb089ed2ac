"""The rehearsal's driver: runs in the child process only (gemma_doctor/rehearse/child.py), with the user's installed
torch / transformers / PEFT / TRL, against the twin in the child's private offline cache.

Each stage appends one JSON line to the events file as soon as it ends, so the parent reads what happened even when
the child is killed at its deadline. A stage that raises is recorded with the exception's type and last line and ends
the run (later stages need its result); a probe's figures go out as they are and the parent judges them
(gemma_doctor/rehearse/invariants.py), so the thresholds live in one pure module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from gemma_doctor.rehearse.grpo import ONLINE_LOOPS
from gemma_doctor.rehearse.rows import ROWS, _read_rows

# Keys of a user's config that the rehearsal overrides or drops: where outputs go, how long it runs, what it
# reports to, and what would reach the network or a GPU.
_FORCED = dict(report_to="none", logging_steps=1, save_strategy="no", push_to_hub=False,
               dataloader_num_workers=0, dataloader_pin_memory=False, torch_compile=False, disable_tqdm=True,
               load_best_model_at_end=False, save_safetensors=True)
_DROPPED = ("output_dir", "logging_dir", "run_name", "hub_model_id", "hub_token", "resume_from_checkpoint",
            "deepspeed", "fsdp", "fsdp_config", "max_steps", "num_train_epochs", "eval_steps", "save_steps",
            "evaluation_strategy", "eval_strategy", "do_eval", "local_rank", "tf32", "bf16_full_eval", "fp16_full_eval",
            "use_liger_kernel", "dataset_num_proc", "model_init_kwargs")
# Why generation and the merge have no model: the save stage reloaded no copy to run them on (a value-head reward
# model's, whose head is saved beside the adapter: Run.save), and a launched script's own model is never used.
_NO_COPY = "no reloaded copy of the checkpoint to run it on (the save stage did not reload one)"
# Optimizers whose kernels need bitsandbytes on a GPU: replaced by AdamW here, and said so.
_GPU_OPTIMIZERS = ("8bit", "paged", "bnb", "galore", "lomo", "apollo")



class Events:
    """The events file: one JSON object per line, flushed as written."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the child's lifetime
        self.started = time.monotonic()

    def write(self, stage: str, status: str, **data: Any) -> None:
        """Record one stage's outcome, with the seconds since the child started (imports included)."""
        elapsed = round(time.monotonic() - self.started, 2)
        self.file.write(json.dumps({"stage": stage, "status": status, **data, "elapsed": elapsed}, default=str) + "\n")
        self.file.flush()


def _error(e: BaseException) -> dict[str, Any]:
    """The exception's type, last line and innermost frames (what the parent shows and matches)."""
    # The whole message on one line: PEFT's and TRL's messages span lines, and their last line alone says nothing.
    message = " ".join(str(e).split())
    line = f"{type(e).__name__}: {message}" if message else type(e).__name__
    frames = traceback.extract_tb(e.__traceback__)[-3:]
    # A ValueError raised by a `raise` statement of the innermost frame is the library checking its inputs (TRL's
    # KTO refusing a micro-batch of one), not a failure deeper down: the parent's fix says so (invariants.crash).
    refused = isinstance(e, ValueError) and bool(frames) and (frames[-1].line or "").lstrip().startswith("raise ")
    return {"exception": type(e).__name__, "line": line if len(line) <= 400 else line[:397] + "...",
            "frames": [f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in frames], "refused": refused}


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _dtype_kw() -> str:
    """from_pretrained's dtype keyword in the installed transformers (``dtype`` from 4.56, ``torch_dtype`` before)."""
    from packaging.version import Version

    return "dtype" if Version(_version("transformers") or "0").release >= (4, 56) else "torch_dtype"


def lora_config(lora: dict[str, Any] | None) -> Any:
    """PEFT's LoraConfig of a plan's LoRA settings (rank, alpha, targets, modules_to_save: runner.settings_of), or None
    for a run without LoRA; the driver's trainer and the 2-rank rehearsal (ranks.py) adapt the twin with it."""
    if not lora:
        return None
    from peft import LoraConfig

    kw: dict[str, Any] = dict(r=int(lora.get("r") or 8), lora_alpha=int(lora.get("alpha") or 16), lora_dropout=0.0,
                              task_type="CAUSAL_LM")
    if lora.get("targets") is not None:
        kw["target_modules"] = lora["targets"]
    if lora.get("modules_to_save"):
        kw["modules_to_save"] = lora["modules_to_save"]
    return LoraConfig(**kw)


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


class Run:
    """One rehearsal of one plan (the parent's JSON), stage by stage."""

    def __init__(self, plan: dict[str, Any], events: Events) -> None:
        self.plan, self.events = plan, events
        self.s: dict[str, Any] = plan["settings"]
        self.work = Path(plan["workdir"])
        self.model: Any = None
        self.tokenizer: Any = None
        self.trainer: Any = None
        self.notes: list[str] = []
        self.rollouts: dict[str, Any] | None = None  # a GRPO run's rollouts, filled by its probe (grpo.py)
        # A loop's own figures for the train record, filled by its probe as it trains (a reward model's: reward.py).
        self.train_extra: dict[str, Any] = {}
        self.device = "cpu"  # settled by load(): asking torch is the child's first heavy import
        # The context of a load one process makes alone (the save stage's reload, the merge's): a launched run's probe
        # steps it out of DeepSpeed ZeRO-3, whose from_pretrained partitions over every rank (hook/probe.py).
        self.one_process: Callable[[], Any] = contextlib.nullcontext

    # -- helpers ---------------------------------------------------------------------------------------------------
    def _load_model(self, where: str, attn: str | None = None) -> Any:
        import torch
        import transformers

        cls = getattr(transformers, self.plan["architecture"])
        dtype = self.s.get("dtype") or "auto"
        kw: dict[str, Any] = {_dtype_kw(): dtype if dtype == "auto" else getattr(torch, dtype)}
        if self.plan.get("reward"):
            # A reward model is the checkpoint as a sequence classifier with one score, as `trl reward` loads it
            # (RewardTrainer: AutoModelForSequenceClassification, num_labels=1); the head is new unless the folder
            # was saved with one (a reload).
            cls, kw["num_labels"] = transformers.AutoModelForSequenceClassification, 1
        if attn:
            kw["attn_implementation"] = attn
        return cls.from_pretrained(where, **kw)

    def _rows(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(train rows, eval rows): the first rows of the user's local dataset, else synthetic chat rows."""
        path = self.s.get("dataset")
        if path:
            rows = _read_rows(Path(path), 12)
            if rows:
                return rows[:8], rows[8:] or rows[:2]
        if self.s.get("completion_only") and self.plan["trainer"] == "trl-sft":
            made = [{"prompt": [{"role": "user", "content": q}], "completion": [{"role": "assistant", "content": a}]}
                    for q, a in ROWS]
        else:
            made = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in ROWS]
        return made[:6], made[6:]

    def _lora(self) -> Any:
        return lora_config(self.s.get("lora"))

    def _args(self, cls: type, output: Path, **over: Any) -> Any:
        raw = {k: v for k, v in (self.plan.get("raw") or {}).items() if k in _fields(cls) and k not in _DROPPED}
        optim = str(raw.get("optim", ""))
        if any(word in optim for word in _GPU_OPTIMIZERS):
            self.notes.append(f"optim {optim} needs bitsandbytes kernels on a GPU: not rehearsable on this machine, "
                              "AdamW used instead")
            raw.pop("optim")
        # An axolotl config (recommend's prescription) names its batch micro_batch_size, which no TrainingArguments
        # field holds: the reader's batch stands in, so the twin trains at the run's batch.
        batch = self.s.get("batch")
        if "per_device_train_batch_size" in _fields(cls) and "per_device_train_batch_size" not in raw \
                and isinstance(batch, int) and not isinstance(batch, bool) and batch > 0:
            raw["per_device_train_batch_size"] = batch
        forced = {**_FORCED, "use_cpu": self.device == "cpu"}
        kw = {**raw, **{k: v for k, v in forced.items() if k in _fields(cls)}, "output_dir": str(output),
              "max_steps": self.plan["steps"], "seed": 0, **over}
        if "eval_strategy" in _fields(cls):
            kw["eval_strategy"] = "no"
        return cls(**kw)

    def _batch(self) -> dict[str, Any]:
        """A fixed probe input: the first eval row through the chat template."""
        import torch

        ids = self.tokenizer.apply_chat_template([{"role": "user", "content": ROWS[0][0]}], add_generation_prompt=True,
                                                 tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return {"input_ids": torch.tensor([list(ids)], device=self.device),
                "attention_mask": torch.ones(1, len(ids), dtype=torch.long, device=self.device)}

    def _logits(self, model: Any) -> Any:
        """The probe input's logits computed in float32, so that the comparisons see what the weights hold (a lost
        head, a dropped delta), not the forward pass's rounding. The model is upcast in place and put back exactly
        (a bf16 value survives the round trip): a deep copy is not the same model, since TRL and accelerate patch
        ``forward`` on the instance with closures that keep calling the original."""
        import itertools

        import torch
        from accelerate.utils import extract_model_from_parallel

        # accelerate wraps the trained model's forward in bf16 autocast for training and leaves it wrapped.
        model = extract_model_from_parallel(model, keep_fp32_wrapper=False)
        cast = {}
        for t in itertools.chain(model.parameters(), model.buffers()):
            if t.is_floating_point() and t.dtype != torch.float32:
                cast[t] = t.dtype
                t.data = t.data.float()
        try:
            model.eval()
            with torch.no_grad():
                return model(**self._batch(), use_cache=False).logits.float().cpu()
        finally:
            for t, dtype in cast.items():
                t.data = t.data.to(dtype)

    # -- stages ----------------------------------------------------------------------------------------------------
    def load(self) -> None:
        """Tokenizer and model from the twin's repo id, as the user's run loads them."""
        import transformers

        self.device = _device(self.plan.get("device") or "cpu")
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.plan["repo_id"])
        self.model = self._load_model(self.plan["repo_id"])
        self.events.write("load", "ok", cls=type(self.model).__name__, dtype=str(self.model.dtype),
                          parameters=sum(p.numel() for p in self.model.parameters()))

    def build_trainer(self) -> None:
        """The user's trainer with the user's settings, capped (a few steps, outputs in the temporary folder)."""
        train, evaluation = self._rows()
        output = self.work / "run"
        if self.plan["trainer"] == "trl-sft":
            from datasets import Dataset
            from trl import SFTConfig, SFTTrainer

            args = self._args(SFTConfig, output)
            self.trainer = SFTTrainer(model=self.model, args=args, train_dataset=Dataset.from_list(train),
                                      eval_dataset=Dataset.from_list(evaluation), processing_class=self.tokenizer,
                                      peft_config=self._lora())
        else:
            import transformers

            model = self.model
            lora = self._lora()
            if lora is not None:
                from peft import get_peft_model

                model = get_peft_model(model, lora)
            tok = self.tokenizer

            def encode(row: dict[str, Any]) -> dict[str, Any]:
                text = row.get("text") if "text" in row else tok.apply_chat_template(row["messages"], tokenize=False)
                return tok(text, add_special_tokens="messages" not in row,
                           truncation=bool(self.s.get("max_length")), max_length=self.s.get("max_length"))

            def prepare(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
                # A list is a map-style dataset to the Trainer: the plain path needs no `datasets` library.
                return [dict(encode(r)) for r in rows]

            axolotl_data = None
            if self.plan.get("axolotl"):
                # An axolotl run: its own prompt strategy labels the rows, its collator pads them (rehearse/axolotl.py).
                from gemma_doctor.rehearse import axolotl

                axolotl_data = axolotl.data(self)
            if axolotl_data is not None:
                train_set, eval_set, collate = axolotl_data
            else:
                train_set, eval_set = prepare(train), prepare(evaluation)
                collate = transformers.DataCollatorForLanguageModeling(tok, mlm=False)
            args = self._args(transformers.TrainingArguments, output, remove_unused_columns=False)
            self.trainer = transformers.Trainer(model=model, args=args, train_dataset=train_set, eval_dataset=eval_set,
                                                data_collator=collate)
        self.model = self.trainer.model
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        self.events.write("setup", "ok", trainer=type(self.trainer).__name__, trainable=trainable, notes=self.notes)

    def labels(self) -> None:
        """What the trainer's own collator trains, on its first batch."""
        batch = next(iter(self.trainer.get_train_dataloader()))
        ids, labels = batch["input_ids"], batch.get("labels")
        if labels is None:
            self.events.write("labels", "ok", per_sample=None, note="the batch has no labels")
            return
        mask = batch.get("attention_mask")
        part = self.plan.get("axolotl") or {}
        ends = {"<end_of_turn>", part.get("terminator") or "<end_of_turn>"}
        eot = [i for i in {*map(self.tokenizer.convert_tokens_to_ids, ends), self.tokenizer.eos_token_id}
               if isinstance(i, int) and i >= 0 and i != self.tokenizer.unk_token_id]
        # The labels of row r are shifted inside the model: a trained position holds the token to predict.
        rows = []
        for r in range(ids.shape[0]):
            real = mask[r].bool() if mask is not None else ids[r] != (self.tokenizer.pad_token_id or -1)
            trained = (labels[r] != -100) & real
            seen = ids[r][real].tolist()
            rows.append({"tokens": int(real.sum()), "trained": int(trained.sum()),
                         "eot_present": any(t in eot for t in seen),
                         "eot_trained": any(int(t) in eot for t in labels[r][trained].tolist()),
                         "prompt_masked": int(((labels[r] == -100) & real).sum())})
        # An axolotl run's rows are its prompt strategy's: the judge names its catalogue entry (rehearse/axolotl.py).
        about = {"axolotl": {k: part[k] for k in ("version", "terminator", "eot_missing", "cured_with") if k in part}} if part else {}
        # axolotl masks the prompt unless train_on_inputs (its part of the plan; absent where its rows were not used).
        completion_only = part.get("completion_only", bool(self.s.get("completion_only")))
        self.events.write("labels", "ok", per_sample=rows, completion_only=completion_only,
                          keys=sorted(batch.keys()), **about)

    def train(self) -> None:
        """A few optimizer steps with probes: loss, gradient norm, which parameters moved."""
        import transformers

        before = {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}
        steps: list[dict[str, Any]] = []
        model, trainer = self.model, self.trainer

        class Probe(transformers.TrainerCallback):
            def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                sq = sum(float(p.grad.detach().float().pow(2).sum()) for p in model.parameters()
                         if p.requires_grad and p.grad is not None)
                # The rate this step applies (the logged learning_rate is the next step's): a warm-up from 0 can
                # cover every rehearsed step (`--steps 1`), and then nothing can move (invariants.judge_train).
                groups = getattr(trainer.optimizer, "param_groups", None) or []
                steps.append({"grad_norm": math.sqrt(sq) if math.isfinite(sq) else sq,
                              "rate": max((float(g.get("lr", 0.0)) for g in groups), default=float("nan"))})

            def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
                if logs and "loss" in logs:
                    steps.append({"loss": float(logs["loss"]), "logged_grad_norm": logs.get("grad_norm")})

        self.trainer.add_callback(Probe())
        self.trainer.train()
        losses = [s["loss"] for s in steps if "loss" in s]
        # The trainer's logged norm is the one before clipping; the probe's (after clipping, in recent releases)
        # stands in where the trainer logs none (max_grad_norm 0).
        norms = [float(s["logged_grad_norm"]) for s in steps if s.get("logged_grad_norm") is not None] or \
                [s["grad_norm"] for s in steps if "grad_norm" in s]
        moved, still, lora_b = [], [], {}
        for n, p in self.model.named_parameters():
            if n in before:
                delta = float((p.detach().float() - before[n].float()).abs().max())
                (moved if delta > 0 else still).append(n)
                if "lora_B" in n:
                    lora_b[n] = (float(before[n].float().norm()), float(p.detach().float().norm()))
        extra: dict[str, Any] = {"learning_rates": [s["rate"] for s in steps if "rate" in s]}
        if extra["learning_rates"] and all(r == 0 for r in extra["learning_rates"]):
            extra["notes"] = [f"the learning rate was 0 at each of the {len(extra['learning_rates'])} rehearsed "
                              "step(s) (a warm-up from 0 covers them): whether the parameters move is not judged; "
                              "rehearse more steps (--steps)"]
        # A GRPO batch is prompts, not collated rows: the diagnosis steps an SFT run's own batches only.
        if any(not math.isfinite(x) for x in [*losses, *norms]) and self.plan["trainer"] not in ONLINE_LOOPS:
            # Where it comes from and which cure removes it, on a fresh twin (gemma_doctor/rehearse/nonfinite.py).
            from gemma_doctor.rehearse import nonfinite

            try:
                extra["nonfinite"] = nonfinite.of_run(self)
            except Exception as e:  # noqa: BLE001 - the diagnosis is extra: the train stage's figures stand
                extra["nonfinite"] = {"error": _error(e).get("line")}
        self.events.write("train", "ok", losses=losses, grad_norms=norms, trainable=len(before), moved=len(moved),
                          unchanged=still[:10], unchanged_count=len(still), **extra,
                          lora_b={"count": len(lora_b), "moved": sum(1 for a, b in lora_b.values() if a != b)},
                          dtype=str(next(self.model.parameters()).dtype), **self.train_extra,
                          **({"rollouts": self.rollouts} if self.rollouts is not None else {}))

    def evaluate(self) -> None:
        """The trainer's evaluation loop (where the HybridCache crash struck)."""
        out = self.trainer.evaluate()
        # A reward model's evaluation also gives TRL's chosen/rejected margin and accuracy (reward.py).
        self.events.write("eval", "ok", eval_loss=out.get("eval_loss"),
                          **{k: out[k] for k in ("eval_margin", "eval_accuracy") if k in out})

    def generate(self) -> None:
        """Greedy generation with and without the KV cache: the same tokens."""
        import torch

        model = self.model
        if model is None:
            self.events.write("generate", "skipped", reason=_NO_COPY)
            return
        model.eval()
        batch = self._batch()
        kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=self.tokenizer.pad_token_id)
        with torch.no_grad():
            cached = model.generate(**batch, use_cache=True, **kw)[0].tolist()
            plain = model.generate(**batch, use_cache=False, **kw)[0].tolist()
        self.events.write("generate", "ok", cached=cached, uncached=plain, prompt=int(batch["input_ids"].shape[1]))

    def save(self, reload: bool = True) -> Any:
        """Save as the trainer saves, reload from the folder, compare logits; the reloaded copy is returned (a launched
        script's probe generates and merges on it, never on the script's own model). ``reload`` false: a launched
        run's rank other than 0, which takes part in the save and the forward (collectives of a sharded model) only."""
        folder = self.work / "checkpoint"
        self.trainer.save_model(str(folder))
        if hasattr(self.model, "v_head"):
            # TRL's value-head wrapper (LLaMA-Factory's rm stage): a tuple for output and the head in a file of its
            # own beside the adapter; reloading a language model would compare what the run never saved as one.
            self.events.write("save", "skipped", reason="a value-head reward model (the head saved beside the "
                              "adapter): its reload is not rehearsed", files=sorted(p.name for p in folder.iterdir()))
            return
        ref = self._logits(self.model)
        if not reload:
            # The folder is rank 0's to write: another rank reading it at once met it half written (FSDP, 2 ranks).
            return None
        with self.one_process():
            if (folder / "adapter_config.json").exists():
                from peft import PeftModel

                reloaded = PeftModel.from_pretrained(self._load_model(self.plan["repo_id"]), str(folder))
            else:
                reloaded = self._load_model(str(folder))
        reloaded.to(self.device)
        got = self._logits(reloaded)
        self.events.write("save", "ok", **_compare(ref, got), files=sorted(p.name for p in folder.iterdir()))
        return reloaded

    def merge(self) -> None:
        """Merge the adapter, compare with base + adapter; save the merged folder, reload, compare (head kept)."""
        if self.model is None:
            self.events.write("merge", "skipped", reason=_NO_COPY)
            return
        if not hasattr(self.model, "merge_and_unload"):
            self.events.write("merge", "skipped", reason="not an adapter run")
            return
        import itertools

        import torch
        from accelerate.utils import extract_model_from_parallel

        ref = self._logits(self.model)

        def base_name(name: str) -> str:
            return name.removeprefix("base_model.model.").replace(".base_layer.", ".")

        # Each tensor's own dtype, put back after the float32 merge: from_pretrained keeps some modules in float32
        # (_keep_in_fp32_modules), which a blanket .to(bf16) would not.
        dtypes = {base_name(n): t.dtype for n, t in itertools.chain(self.model.named_parameters(),
                                                                     self.model.named_buffers()) if "lora_" not in n}
        saved_dtype = next(iter(dtypes.values()))
        # Merged in float32, then saved in the checkpoint's dtype: merging into bf16 weights rounds every delta,
        # which on a twin's small random weights alone moved logits by 25% (Gemma 4, measured). The merge's logic
        # (deltas, scaling) is what this stage checks; the save and reload then check the folder.
        model = extract_model_from_parallel(self.model, keep_fp32_wrapper=False).to(torch.float32)
        merged = model.merge_and_unload()
        exact = self._logits(merged)
        for n, t in itertools.chain(merged.named_parameters(), merged.named_buffers()):
            if n in dtypes and t.dtype != dtypes[n]:
                t.data = t.data.to(dtypes[n])
        in_memory = self._logits(merged)
        folder = self.work / "merged"
        merged.save_pretrained(str(folder))
        self.tokenizer.save_pretrained(str(folder))
        with self.one_process():
            reloaded = self._load_model(str(folder)).to(self.device)
        got = self._logits(reloaded)
        self.events.write("merge", "ok", merged=_compare(ref, exact), reloaded=_compare(in_memory, got),
                          dtype=str(saved_dtype))


def _compare(ref: Any, got: Any) -> dict[str, Any]:
    """Largest absolute difference of two logits tensors, and the scale it is judged against."""
    if ref.shape != got.shape:
        return {"max_abs_diff": None, "scale": None, "shapes": [list(ref.shape), list(got.shape)]}
    return {"max_abs_diff": float((ref - got).abs().max()), "scale": float(ref.abs().max())}


def _device(asked: str) -> str:
    """Where the twin trains: ``cpu``, or ``cuda`` where asked (``auto``/``cuda``) and torch sees a CUDA device. A GPU
    asked for by name and not there is the load stage's failure, not a silent CPU run."""
    if asked == "cpu":
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if asked == "cuda":
        raise RuntimeError(f"--device cuda: torch {torch.__version__} sees no CUDA device here")
    return "cpu"


def stack(events: Events, device: str = "cpu") -> None:
    """Record the versions of the libraries the child runs with, and the device it trains on."""
    where: dict[str, Any] = {"device": device}
    if device != "cpu":
        try:
            where["device"] = _device(device)
        except RuntimeError as e:
            where["device_error"] = str(e)
        if where["device"] == "cuda":
            import torch

            props = torch.cuda.get_device_properties(0)
            where.update(gpu=str(props.name), compute_capability=f"{props.major}.{props.minor}")
    events.write("stack", "ok", **{name: _version(name) for name in
                                   ("torch", "transformers", "peft", "trl", "accelerate", "datasets")},
                 python=sys.version.split()[0], **where)


def _accumulation(run: Run) -> None:
    """The gradient accumulation check, on fresh twins of its own (gemma_doctor/rehearse/accumulation.py)."""
    from gemma_doctor.rehearse import accumulation

    accumulation.check(run, _setup)


def _setup(run: Run) -> None:
    """The trainer: TRL's DPO, KTO or ORPO trainer for such a run (gemma_doctor/rehearse/preference.py), its
    GRPOTrainer for a GRPO run (grpo.py), its RewardTrainer for reward modelling (reward.py), else Run.build_trainer."""
    from gemma_doctor.rehearse import preference, reward

    if run.plan["trainer"] == reward.LOOP:
        reward.setup(run)
    elif run.plan["trainer"] in preference.LOOPS:
        preference.setup(run)
    elif run.plan["trainer"] in ONLINE_LOOPS:
        from gemma_doctor.rehearse import grpo

        grpo.setup(run)
    else:
        run.build_trainer()


def _labels(run: Run) -> None:
    """What the collator trains; a preference batch holds no labels (gemma_doctor/rehearse/preference.py), nor does a
    reward model's (reward.py)."""
    from gemma_doctor.rehearse import preference, reward

    if run.plan["trainer"] in preference.LOOPS or run.plan["trainer"] == reward.LOOP:
        preference.labels(run)
    else:
        run.labels()


STAGES: dict[str, Callable[[Run], None]] = {
    "load": Run.load, "setup": _setup, "labels": _labels, "train": Run.train, "eval": Run.evaluate,
    "generate": Run.generate, "save": Run.save, "merge": Run.merge, "accumulation": _accumulation,
}


def run(plan: dict[str, Any], events: Events) -> int:
    """Every stage of ``plan`` in order; the first that raises is recorded and ends the run (exit 0: the parent
    judges the events)."""
    r = Run(plan, events)
    for name in plan["stages"]:
        try:
            STAGES[name](r)
        except Exception as e:  # noqa: BLE001 - a stage's failure is the rehearsal's result, reported by the parent
            events.write(name, "error", **_error(e))
            return 0
    events.write("done", "ok")
    return 0
