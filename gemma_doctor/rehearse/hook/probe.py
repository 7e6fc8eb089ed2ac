"""The Trainer probe of `rehearse --launch` (docs/rehearsal.md, "The user's own script"): armed by the child's
sitecustomize, it wraps transformers.Trainer when the script first imports it (TRL's trainers are subclasses, so
they are wrapped too) and writes what the run shows to the events file, as the driver's stages do, so that the
parent judges a launched script with the same invariants (gemma_doctor/rehearse/invariants.py).

The user's script is never edited. What the wrapper changes on the Trainer's arguments: a few steps (max_steps),
evaluation and saving every step where the script configured them, logging every step, outputs under the
temporary folder, no reporting or pushing anywhere. After train() returns, the checkpoint is saved and reloaded
into a copy, and the driver's generate and merge stages run on that copy (the script goes on with its own model).
DeepSpeed's torch backend, where the script starts one, starts without its CPU shared-memory op, as on a GPU
(`_no_shm_op`). Runs in the child only: it imports transformers, never the parent.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import importlib.abc
import importlib.machinery
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

_MODULE = "transformers.trainer"
_ARGS_MODULE = "transformers.training_args"
_DEEPSPEED_COMM = "deepspeed.comm.torch"


class _State:
    """The plan and the events file of this process; one per child process."""

    def __init__(self, plan: dict[str, Any]) -> None:
        from gemma_doctor.rehearse.driver import Events

        self.plan = plan
        self.root = Path(plan["root"]).resolve()
        # Under a launcher (accelerate, torchrun) every rank runs the script: rank 0 speaks for the run, and every
        # rank for its own crash (a rank that crashes alone is otherwise heard only as the launcher's exit status).
        self.rank = int(os.environ.get("RANK", "0") or 0)
        self.world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        self.speaks = self.rank == 0
        self.events = Events(Path(plan["events"]))
        self.trainers = 0
        self.evaluated = False
        # True while the probe's own copies of the script's Trainer are built and trained (the accumulation check,
        # the resume): the wrappers then pass straight through (no caps, no probe, no record of theirs).
        self.quiet = False

    def write(self, stage: str, status: str, **data: Any) -> None:
        """One record: from rank 0, or a crash from any rank (its line then names the rank)."""
        if status == "error" and self.world > 1:
            data = {**data, "rank": self.rank, "line": f"[rank {self.rank}] {data.get('line', '')}"}
        elif not self.speaks:
            return
        self.events.write(stage, status, **data)

    def error(self, stage: str, e: BaseException) -> None:
        """A stage that raised, recorded once (the wrappers nest: evaluation runs inside train)."""
        from gemma_doctor.rehearse.driver import _error

        if getattr(e, "_gemma_doctor_recorded", False):
            return
        self.write(stage, "error", **_error(e))
        try:
            e._gemma_doctor_recorded = True  # type: ignore[attr-defined]
        except AttributeError:  # an exception type with __slots__: recorded twice at worst
            pass

    def in_step_failed(self, stage: str, e: BaseException) -> None:
        """A stage every rank runs in step (the accumulation check's and the resume's copies of the trainer, whose
        training all-reduces on every step) raised on this rank: recorded, and on several ranks this rank ends.

        Going on, as on one process, leaves the ranks out of step: the other rank waits in that stage's collective while
        this one enters the next stage's (measured: rank 1 failing in the accumulation check went on to the resume
        and both ranks held until the rehearsal's deadline, GD952). A rank that ends closes its gloo connections: a
        rank waiting on it fails at once ("Connection closed by peer"), and torch's launcher stops the rest
        (torch 2.13 elastic agent: a failed worker with no restarts left stops the worker group). The record says the
        rank ended (``ends_rank``): the parent reports this failure as the run's and another rank's that follows it
        as its consequence (launch.first_failure)."""
        from gemma_doctor.rehearse.driver import _error

        if self.world <= 1:
            self.error(stage, e)
            return
        self.write(stage, "error", **_error(e), ends_rank=True)
        import traceback

        traceback.print_exception(e)  # the rank's own traceback in the launch's log
        for stream in (self.events.file, sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(1)


STATE: _State | None = None


class _Silent:
    """The events of a rank other than 0: its stages run in step with rank 0's (collectives), unrecorded."""

    def write(self, stage: str, status: str, **data: Any) -> None:
        """Drop the record."""


def arm(plan_path: str) -> None:
    """Read the plan; wrap the Trainer when transformers.trainer is imported; record an uncaught exception's stage."""
    global STATE
    STATE = _State(json.loads(Path(plan_path).read_text()))
    sys.meta_path.insert(0, _Finder())
    for name, wrap in _WRAPS.items():
        if name in sys.modules:
            wrap(sys.modules[name])
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        # Only where the stack was imported: a launcher (accelerate launch, torchrun) re-raises its worker's
        # failure, already recorded by the worker, as its own; a script that dies before importing transformers
        # is reported by the parent from its exit status and last line.
        if STATE is not None and isinstance(value, Exception) and "transformers" in sys.modules:
            STATE.error(_stage_of(tb), value)
        previous(kind, value, tb)

    sys.excepthook = excepthook


def _stage_of(tb: Any) -> str:
    """The stage an exception raised outside the Trainer's own methods belongs to: loading, else the script."""
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "from_pretrained":
            return "load"
        tb = tb.tb_next
    return "script"


class _Finder(importlib.abc.MetaPathFinder):
    """Finds transformers.trainer, transformers.training_args and deepspeed.comm.torch as the path finder does, with a
    loader that wraps their classes (or function) once executed."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in _WRAPS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, _WRAPS[name])
        return spec


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, wrap: Any) -> None:
        self.inner, self.wrap = inner, wrap

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        self.wrap(module)


def _wrap_args(module: Any) -> None:
    """TrainingArguments (and TRL's configs, its subclasses) on the CPU where no GPU is present: a bf16 / fp16 run
    written for a GPU is then rehearsed on the CPU (bf16 autocast), not refused by the arguments' own check."""
    cls = module.TrainingArguments
    if getattr(cls, "_gemma_doctor_probe", False):
        return
    cls._gemma_doctor_probe = True
    post_init = cls.__post_init__

    @functools.wraps(post_init)
    def __post_init__(self: Any, *a: Any, **kw: Any) -> None:
        import torch

        if not torch.cuda.is_available() and not getattr(self, "use_cpu", True):
            self.use_cpu = True
        post_init(self, *a, **kw)

    cls.__post_init__ = __post_init__


def _strategy(current: Any, value: str) -> Any:
    """``value`` in the type the arguments hold (an IntervalStrategy / SaveStrategy enum, or a string)."""
    return type(current)(value) if isinstance(current, enum.Enum) else value


def _is_no(value: Any) -> bool:
    return str(getattr(value, "value", value)).lower() == "no"


def cap(args: Any, steps: int, output: Path, root: Path) -> list[str]:
    """Cap the Trainer's arguments in place for the rehearsal; the notes say what changed."""
    notes = []
    args.max_steps = steps
    if not Path(str(args.output_dir or ".")).resolve().is_relative_to(root):
        notes.append(f"output_dir {args.output_dir} is outside the rehearsal's folder: written under it instead")
        args.output_dir = str(output)
    for name, value in (("report_to", []), ("push_to_hub", False), ("hub_token", None), ("disable_tqdm", True),
                        ("load_best_model_at_end", False), ("dataloader_num_workers", 0),
                        ("dataloader_prefetch_factor", None), ("logging_steps", 1)):
        if hasattr(args, name):
            setattr(args, name, value)
    args.logging_strategy = _strategy(args.logging_strategy, "steps")
    for strategy, every in (("eval_strategy", "eval_steps"), ("evaluation_strategy", "eval_steps"),
                            ("save_strategy", "save_steps")):
        current = getattr(args, strategy, None)
        if current is not None and not _is_no(current):
            setattr(args, strategy, _strategy(current, "steps"))
            setattr(args, every, 1)
    return notes


def _wrap(module: Any) -> None:
    """Wrap Trainer.__init__ / train / evaluate in ``module`` (transformers.trainer), once."""
    trainer_cls = module.Trainer
    if getattr(trainer_cls, "_gemma_doctor_probe", False):
        return
    trainer_cls._gemma_doctor_probe = True
    init, train, evaluate = trainer_cls.__init__, trainer_cls.train, trainer_cls.evaluate
    _INIT[:] = [init]

    @functools.wraps(init)
    def __init__(self: Any, *a: Any, **kw: Any) -> None:
        s = STATE
        if s.quiet:
            init(self, *a, **kw)
            return
        # The script's own constructor arguments: the probe's copies of this trainer are built from them (copy_of).
        self._gemma_doctor_init = (a, dict(kw))
        args = kw.get("args", a[1] if len(a) > 1 else None)
        notes = cap(args, s.plan["steps"], s.root / "work" / "output", s.root) if args is not None else []
        try:
            init(self, *a, **kw)
        except Exception as e:
            s.error("setup", e)
            raise
        # What transformers' __init__ left: what a subclass (or the script) changes after it is told apart from it
        # (copy_of puts those changes back on its copies).
        self._gemma_doctor_base = dict(vars(self))
        if args is None:  # the trainer made its own arguments
            notes = cap(self.args, s.plan["steps"], s.root / "work" / "output", s.root)
        s.trainers += 1
        self._gemma_doctor_probe = _probe_callback(module)(self)
        self.add_callback(self._gemma_doctor_probe)
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        asked = _fsdp_asked(self)
        if asked is not None:
            notes = [*notes, asked]
            wrap = _wrap_check(self)
            if wrap is not None:
                s.write("wrap", "ok", **wrap)
        s.write("setup", "ok", trainer=type(self).__name__, trainable=trainable, notes=notes,
                ranks=int(os.environ.get("WORLD_SIZE", "1") or 1), sharding=_sharding(self))

    @functools.wraps(train)
    def _train(self: Any, *a: Any, **kw: Any) -> Any:
        s = STATE
        if s.quiet:
            return train(self, *a, **kw)
        self._gemma_doctor_at_train = dict(vars(self))
        resumed = bool(kw.pop("resume_from_checkpoint", None) or (a and a[0])
                       or getattr(self.args, "resume_from_checkpoint", None))
        if a:
            a = (None, *a[1:])
        if resumed:
            # The user's checkpoint is the real model's: the twin trains from the start, saving a checkpoint at every
            # step, and after train() a copy of the trainer resumes from one of them (resume()).
            _saves_every_step(self.args)
        run = _run(self)
        try:
            next(iter(self.get_train_dataloader()))  # the user's collator on the first batch, as train will call it
        except Exception as e:
            s.error("labels", e)
            raise
        try:
            run.labels()
        except Exception as e:  # noqa: BLE001 - a batch the probe cannot read (labels of another shape) is the
            # training step's to fail on, or not: the probe's own trouble must not stop the script
            from gemma_doctor.rehearse.driver import _error

            s.write("labels", "skipped", reason=f"the first batch could not be read: {_error(e)['line']}")
        try:
            out = train(self, *a, **kw)
        except Exception as e:
            s.error("train", e)
            raise
        try:
            reloaded = run.save(reload=s.speaks)
        except Exception as e:  # noqa: BLE001 - the save stage's failure is a finding, the script goes on
            s.error("save", e)
        else:
            on_the_copy(run, reloaded)
        accumulation(self)
        if resumed:
            resume(self)
        return out

    @functools.wraps(evaluate)
    def _evaluate(self: Any, *a: Any, **kw: Any) -> Any:
        s = STATE
        if s.quiet:
            return evaluate(self, *a, **kw)
        try:
            out = evaluate(self, *a, **kw)
        except Exception as e:
            s.error("eval", e)
            raise
        if not s.evaluated:
            s.evaluated = True
            s.write("eval", "ok", eval_loss=(out or {}).get("eval_loss"))
        return out

    trainer_cls.__init__, trainer_cls.train, trainer_cls.evaluate = __init__, _train, _evaluate


def _no_shm_op(module: Any) -> None:
    """DeepSpeed's torch backend as it starts on the GPU: without its shared-memory all-reduce op.

    On CPU ranks DeepSpeed 0.19.8's `TorchBackend.__init__` calls `build_shm_op()`, which JIT-builds the CPU
    accelerator's `deepspeed_shm_comm` (minutes of g++ on a first start, docs/rehearsal.md). The run rehearsed uses no
    such op: on a GPU the CUDA accelerator has no `ShareMemCommBuilder` (its op builders leave out op_builder/cpu but
    for the CPU optimizers), so `build_shm_op()` returns None there, and the op serves only `inference_all_reduce`
    (AutoTP's layers), which without it all-reduces through the process group, as it does on a GPU. So the CPU ranks
    start DeepSpeed's backend as the GPU ranks do, with None; DeepSpeed's other JIT builds (the CPU optimizers of an
    offloading config) are built as before."""
    if hasattr(module, "build_shm_op"):
        module.build_shm_op = lambda: None


_WRAPS = {_MODULE: _wrap, _ARGS_MODULE: _wrap_args, _DEEPSPEED_COMM: _no_shm_op}


def on_the_copy(run: Any, reloaded: Any) -> None:
    """The driver's generate and merge stages on the copy the save stage reloaded: the script's own model, which it
    goes on using after train(), is never generated from nor merged. Rank 0 only (these stages run no collective)."""
    if not STATE.speaks:
        return
    model = run.model
    run.model = reloaded
    try:
        for name, stage in (("generate", run.generate), ("merge", run.merge)):
            try:
                # Out of ZeRO-3 for rank 0's copy: generate() syncs every rank at each token under it (synced_gpus),
                # which the other rank never joins (both ranks hung, measured).
                with _one_process():
                    stage()
            except Exception as e:  # noqa: BLE001 - each stage's failure is a finding; the copy's next stage and
                # the script go on (the merge needs no generation, and the script never sees this copy)
                STATE.error(name, e)
    finally:
        run.model = model


# TRL's trainers whose batches the check cannot split: KTO's KL term is estimated across each micro-batch; the online
# loops generate their own batches (the driver runs no accumulation stage for them either).
_NOT_SPLIT = {"KTOTrainer": "KTO estimates its KL term across the rows of each micro-batch: b x k and one batch of b*k "
                            "differ by design",
              **{name: "an online loop generates and scores its own batches: b x k and one batch of b*k are other "
                       "rollouts" for name in ("GRPOTrainer", "RLOOTrainer", "OnlineDPOTrainer")}}


def copy_of(trainer: Any, output: Path, **changes: Any) -> Any:
    """The script's Trainer made again: an object of its own class holding its attributes (a subclass's own settings:
    TRL's, LLaMA-Factory's), on which transformers' Trainer.__init__ runs afresh with the arguments the script's trainer
    gave it (its model as trained, collator, prepared training rows, compute_loss_func ...) and a copy of its (capped)
    TrainingArguments with ``changes`` made. The probe's runs then go through the script's own compute_loss, collator
    and model; nothing is prepared or wrapped twice. Its callbacks, evaluation set and optimizer are not taken (the copy
    writes no report and builds its own optimizer). Call while STATE.quiet."""
    import copy
    import inspect

    import torch

    # A shallow copy, no __post_init__ again: the arguments stay exactly as the script's trainer had them.
    args = copy.copy(trainer.args)
    for name, value in {"output_dir": str(output), "logging_steps": 1, "do_eval": False, **changes}.items():
        if hasattr(args, name):
            setattr(args, name, value)
    # The copies neither evaluate nor save: what they check is the training step.
    for strategy in ("eval_strategy", "evaluation_strategy", "save_strategy"):
        if getattr(args, strategy, None) is not None:
            setattr(args, strategy, _strategy(getattr(args, strategy), "no"))
    a, kw = trainer._gemma_doctor_init
    names = [p.name for p in list(inspect.signature(_INIT[0]).parameters.values())[1:]
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    kw = {**dict(zip(names, a)), **kw, "model": trainer.model, "args": args}
    for name in ("callbacks", "eval_dataset", "model_init"):
        kw.pop(name, None)
    kw.pop("optimizers", None)
    again = object.__new__(type(trainer))
    vars(again).update(vars(trainer))  # a subclass's attributes set before it called Trainer.__init__
    torch.manual_seed(0)
    _INIT[0](again, **kw)
    # What the subclass's __init__ (or the script) changed after Trainer.__init__ and before train(): TRL's
    # model_accepts_loss_kwargs, a loss of its own ... The copy's own arguments, model and runtime stay its.
    base, at_train = trainer._gemma_doctor_base, getattr(trainer, "_gemma_doctor_at_train", {})
    vars(again).update({k: v for k, v in at_train.items()
                        if k not in _FRESH and (k not in base or base[k] is not v)})
    return again


# A Trainer's attributes that its copy keeps from its own Trainer.__init__ (copy_of). The training rows are not among
# them: a script that sets trainer.train_dataset after building it trains on those, and so must the resumed copy (the
# same rows in the same order, or its loss is another's).
_FRESH = frozenset(("args", "model", "model_wrapped", "callback_handler", "optimizer", "lr_scheduler", "state",
                    "control", "accelerator", "eval_dataset", "_gemma_doctor_base", "_gemma_doctor_at_train",
                    "_gemma_doctor_probe"))


# transformers' own Trainer.__init__, unwrapped (copy_of runs it on a copy).
_INIT: list[Any] = []


class _Kept:
    """The script's model exactly as it was after train(), put back after the probe's runs on it: its parameters (the
    runs' optimizer steps, a checkpoint loaded into it), the forward accelerate wraps at each Trainer's preparation,
    its dropout (off for the check, whose two runs must see the same model) and its train/eval mode."""

    def __init__(self, model: Any, dropout: bool = True) -> None:
        self.model, self.dropout = model, dropout

    def __enter__(self) -> None:
        import torch

        model = self.model
        self.params = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.attrs = {name: vars(model).get(name) for name in ("forward", "_original_forward")}
        self.training = model.training
        self.rates = [(m, m.p) for m in model.modules() if isinstance(m, torch.nn.Dropout)]
        if not self.dropout:
            for m, _ in self.rates:
                m.p = 0.0

    def __exit__(self, *exc: Any) -> None:
        import torch

        model = self.model
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in self.params and p.shape == self.params[n].shape:
                    p.copy_(self.params[n])
                p.grad = None
        for name, value in self.attrs.items():
            if value is None:
                vars(model).pop(name, None)
            else:
                setattr(model, name, value)
        for m, rate in self.rates:
            m.p = rate
        model.train(self.training)


def accumulation(trainer: Any) -> None:
    """The gradient accumulation check (gemma_doctor/rehearse/accumulation.py) on copies of the script's Trainer, after
    its training: b x k against one batch of b*k, learning rate 0, dropout off. Never stops the script."""
    from gemma_doctor.rehearse import accumulation as check
    from gemma_doctor.rehearse.driver import _error

    s = STATE
    why = next((_NOT_SPLIT[c.__name__] for c in type(trainer).__mro__ if c.__name__ in _NOT_SPLIT), None)
    if why is None and s.world > 1:
        why = _sharded_ranks(trainer, "check")
    if why is None and not hasattr(trainer, "_gemma_doctor_init"):
        why = "the trainer was built before the probe was armed"
    if why is not None:
        s.write("accumulation", "skipped", reason=why)
        return

    def copy(micro: int, k: int) -> Any:
        try:
            return copy_of(trainer, s.root / "work" / f"accumulation-{micro}x{k}", per_device_train_batch_size=micro,
                           gradient_accumulation_steps=k, learning_rate=0.0, warmup_steps=0, warmup_ratio=0.0, seed=0,
                           max_steps=1)
        except Exception as e:  # noqa: BLE001 - the probe could not build the script's trainer again (its own
            # constructor's needs): the check's trouble, said, not a failure of the run
            raise _NotBuilt(_error(e)["line"]) from e

    s.quiet = True
    try:
        with _Kept(trainer.model, dropout=False):
            check.check_launched(trainer, copy, s, ranks=s.world)
    except _NotBuilt as e:
        s.write("accumulation", "skipped", reason=f"the script's trainer could not be built again: {e}")
    except Exception as e:  # noqa: BLE001 - the check's failure is a finding; the script goes on (on one process)
        s.in_step_failed("accumulation", e)
    finally:
        s.quiet = False


def _saves_every_step(args: Any) -> None:
    """A checkpoint at every step, none rotated away: the resume needs one saved before the last step."""
    args.save_strategy = _strategy(args.save_strategy, "steps")
    args.save_steps = 1
    if hasattr(args, "save_total_limit"):
        args.save_total_limit = None


def _step_of(folder: Path) -> int:
    tail = folder.name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def resume(trainer: Any) -> None:
    """resume_from_checkpoint rehearsed: a copy of the script's trainer (copy_of) resumes from the last checkpoint its
    train() saved before the last step and trains to that step again. Recorded: the steps it trains, whether the
    optimizer's state was restored, the rate and loss of each resumed step against the first run's at that step, and how
    far the parameters at the end are from the first run's. Never stops the script."""
    s = STATE
    probe = getattr(trainer, "_gemma_doctor_probe", None)
    last = trainer.state.global_step
    saved = sorted((p for p in Path(str(trainer.args.output_dir)).glob("checkpoint-*") if 0 < _step_of(p) < last),
                   key=_step_of)
    why = None
    if s.world > 1 and _sharded_ranks(trainer, "resume"):
        why = _sharded_ranks(trainer, "resume")
    elif probe is None or not hasattr(trainer, "_gemma_doctor_init"):
        why = "the trainer was built before the probe was armed"
    elif any(x is not None for x in trainer._gemma_doctor_init[1].get("optimizers") or ()):
        # The copy builds the Trainer's own optimizer: another's saved state would not load into it, a crash of ours.
        why = "the script passes its own optimizer or scheduler (optimizers=...): its resume is not rehearsed"
    elif not saved:
        why = f"no checkpoint was saved before the last step ({last}): rehearse more steps (--steps 2 or more)"
    if why is not None:
        s.write("resume", "skipped", reason=why)
        return
    checkpoint = saved[-1]
    start = _step_of(checkpoint)
    # The parameters the uninterrupted run's optimizer holds a state for: one whose gradient is never set (a LoRA of
    # a tower the text rows never run) has none there either, so none to restore.
    expected = _with_state(trainer.optimizer)[1]
    seen: dict[str, Any] = {"steps": [], "losses": [], "rates": [], "restored": None}
    model = trainer.model
    s.quiet = True
    try:
        with _Kept(model):
            after = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
            again = copy_of(trainer, s.root / "work" / "resume", max_steps=last)
            again.add_callback(_resume_callback(again, seen))
            again.train(resume_from_checkpoint=str(checkpoint))
            got = {n: p.detach() for n, p in again.model.named_parameters() if n in after}
            diff = max((float((got[n].float() - after[n].float()).abs().max()) for n in got), default=None)
            scale = max((float(after[n].float().abs().max()) for n in got), default=None)
    except Exception as e:  # noqa: BLE001 - the resume's crash is a finding (its stage: resume); the script goes on
        # (on one process)
        s.in_step_failed("resume", e)
        return
    finally:
        s.quiet = False
    first = probe.logged
    s.write("resume", "ok", checkpoint=start, last=last, files=sorted(p.name for p in checkpoint.iterdir()),
            steps=seen["steps"], losses=seen["losses"],
            expected_losses=[first[t - 1]["loss"] if 0 < t <= len(first) else None for t in seen["steps"]],
            learning_rates=seen["rates"],
            expected_rates=[probe.rates[t - 1] if 0 < t <= len(probe.rates) else None for t in seen["steps"]],
            optimizer_restored={**(seen["restored"] or {}), "uninterrupted": expected}, params_max_abs_diff=diff,
            params_scale=scale,
            params_compared=len(got))


def _with_state(optimizer: Any) -> tuple[int, int]:
    """(parameters of ``optimizer``, those it holds a state for)."""
    optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
    params = [p for g in getattr(optimizer, "param_groups", None) or [] for p in g["params"]]
    held = getattr(optimizer, "state", {})
    return len(params), sum(1 for p in params if held.get(p))


def _resume_callback(trainer: Any, seen: dict[str, Any]) -> Any:
    """What the resumed copy does: the global step of each step it trains, its loss and rate, and whether the
    optimizer held a state for its parameters when training began (restored from the checkpoint)."""
    base = sys.modules["transformers.trainer_callback"].TrainerCallback

    class Resumed(base):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            params, held = _with_state(trainer.optimizer)
            seen["restored"] = {"params": params, "with_state": held}

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            groups = getattr(trainer.optimizer, "param_groups", None) or []
            seen["rates"].append(max((float(g.get("lr", 0.0)) for g in groups), default=float("nan")))
            seen["steps"].append(state.global_step + 1)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                seen["losses"].append(float(logs["loss"]))

    return Resumed()


class _NotBuilt(Exception):
    """The probe's copy of the script's trainer could not be built."""


def _run(trainer: Any) -> Any:
    """The driver's stages (labels, save and reload, then generate and merge on the reloaded copy) bound to the
    script's trainer instead of the driver's own."""
    import transformers

    from gemma_doctor.rehearse.driver import Run

    s = STATE
    model = trainer.model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    dtype = str(getattr(base, "dtype", "")).removeprefix("torch.")
    # The script's own class reloads the checkpoint; a class transformers does not export (the script's own
    # subclass) is reloaded as the checkpoint's.
    architecture = type(base).__name__ if hasattr(transformers, type(base).__name__) else s.plan["architecture"]
    plan = {**s.plan, "architecture": architecture, "workdir": str(s.root / "work" / "rehearsal"),
            "settings": {"dtype": dtype or None, "completion_only": False}}
    run = Run(plan, s.events if s.speaks else _Silent())
    run.trainer, run.model = trainer, model
    run.one_process = _one_process
    tok = getattr(trainer, "processing_class", None) or getattr(trainer, "tokenizer", None)
    tok = getattr(tok, "tokenizer", tok)  # a processor holds its tokenizer
    run.tokenizer = tok if tok is not None else transformers.AutoTokenizer.from_pretrained(s.plan["repo_id"])
    return run


def _sharding(trainer: Any) -> str | None:
    """How the Trainer shards the run as it set itself up: "deepspeed zero N", "fsdp", or None (one process, DDP)."""
    if getattr(trainer, "is_deepspeed_enabled", False):
        plugin = getattr(getattr(trainer.accelerator, "state", None), "deepspeed_plugin", None)
        return f"deepspeed zero {getattr(plugin, 'zero_stage', '?')}"
    return "fsdp" if getattr(trainer, "is_fsdp_enabled", False) else None


def _fsdp_asked(trainer: Any) -> str | None:
    """A note where the script's arguments ask for FSDP (TrainingArguments ``fsdp``) and the Trainer did not turn it
    on: accelerate 1.15 enables FSDP only for accelerator devices (accelerate/state.py: MULTI_CPU is not among the
    types it turns into FSDP), so on CPU ranks the Trainer trains every rank a whole replica (DDP), said, not hidden."""
    args = trainer.args
    if getattr(trainer, "is_fsdp_enabled", False) or not getattr(args, "fsdp", None) \
            or getattr(args, "fsdp_plugin_args", None) is None:
        return None
    version = (args.fsdp_plugin_args or {}).get("fsdp_version", "?")
    return (f"the script asks for FSDP (version {version}) and the Trainer did not turn it on: accelerate runs CPU "
            "ranks as MULTI_CPU and enables FSDP only on accelerator devices, so every rank trained a whole replica "
            "(DDP); the sharding, its wrap classes and its sharded save are not rehearsed here (rehearse them with "
            "--accelerate-config, or on a GPU)")


# accelerate 1.15's words (FullyShardedDataParallelPlugin.set_auto_wrap_policy) for a wrap class the model lacks.
_WRAP_CLASS = "Could not find the transformer layer class"


def _wrap_check(trainer: Any) -> dict[str, Any] | None:
    """Where the script asks for FSDP and the Trainer did not turn it on (CPU ranks, _fsdp_asked): the wrap classes
    resolved as accelerate resolves them when it prepares the model on a GPU (the plugin the Trainer built from
    ``fsdp_plugin_args``, its set_auto_wrap_policy on the script's model). A class the model lacks stops a GPU run there
    ("Could not find the transformer layer class ..."): the record says so (GD994). None where they resolve; the probe's
    own trouble building the plugin is not the run's and is passed over."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    try:
        plugin = FullyShardedDataParallelPlugin(**trainer.args.fsdp_plugin_args)
        plugin.set_auto_wrap_policy(trainer.model)
    except ValueError as e:
        if _WRAP_CLASS not in str(e):
            return None
        layers = sorted({type(m).__name__ for m in trainer.model.modules() if type(m).__name__.endswith("DecoderLayer")})
        names = getattr(plugin, "transformer_cls_names_to_wrap", None) or []
        return {"missing": True, "classes": list(names) if not isinstance(names, str) else names.split(","),
                "line": str(e).strip().splitlines()[0], "suggest": ", ".join(layers)}
    except Exception:  # noqa: BLE001 - the probe's own trouble (a plugin it cannot build here) is not the run's
        return None
    return None


def _sharded_ranks(trainer: Any, what: str) -> str | None:
    """Why the accumulation check or the resume (``what``) is not run on this run's ranks, or None where it is: on
    ranks that each hold the whole model (DDP) both run on every rank in step (each rank its own rows, collectives
    matched), exact as on one process; under DeepSpeed or FSDP the copies would build the engine again over the
    sharded model, which is not measured."""
    sharding = _sharding(trainer)
    if sharding is None:
        return None
    return (f"the {what} is not rehearsed on ranks that shard the model ({sharding}): its copy of the trainer would "
            "build the engine again over the sharded parameters (not measured); rehearse the run on one process")


@contextlib.contextmanager
def _one_process() -> Any:
    """A load rank 0 makes alone (the probe's reloads): under DeepSpeed ZeRO-3, transformers' from_pretrained would
    partition the model over every rank (zero.Init, a collective the other rank never joins: both ranks hung, measured),
    so the Trainer's DeepSpeed config is stepped out of for the load (transformers' own unset/set pair) and put back."""
    from transformers.integrations import deepspeed as ds

    config = ds._hf_deepspeed_config_weak_ref() if ds._hf_deepspeed_config_weak_ref is not None else None
    if config is None or not ds.is_deepspeed_zero3_enabled():
        yield
        return
    ds.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        ds.set_hf_deepspeed_config(config)


def _gathered(model: Any) -> Any:
    """A context in which the trainable parameters hold their full values: under DeepSpeed ZeRO-3 each rank holds a
    shard and the parameter itself is empty, so they are gathered (a collective: every rank's probe calls it in step);
    otherwise nothing to do."""
    import contextlib

    partitioned = [p for p in model.parameters() if p.requires_grad and hasattr(p, "ds_id")]
    if not partitioned:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None)


def _probe_callback(module: Any) -> type:
    """The callback class, built on the module's own TrainerCallback (imported by then)."""
    base = sys.modules["transformers.trainer_callback"].TrainerCallback

    class Probe(base):
        """Loss and gradient norm per step, which trainable tensors moved, whether LoRA B moved."""

        def __init__(self, trainer: Any) -> None:
            self.trainer = trainer
            self.before: dict[str, Any] = {}
            self.norms: list[float] = []
            self.rates: list[float] = []
            self.logged: list[dict[str, Any]] = []

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            model = self.trainer.model
            with _gathered(model):
                self.before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            sq = sum(float(p.grad.detach().float().pow(2).sum()) for p in self.trainer.model.parameters()
                     if p.requires_grad and p.grad is not None)
            self.norms.append(math.sqrt(sq) if math.isfinite(sq) else sq)
            # The rate this step applies (the logged learning_rate is the next step's): a warm-up can make it 0 at
            # every rehearsed step, and then nothing can move.
            groups = getattr(self.trainer.optimizer, "param_groups", None) or []
            self.rates.append(max((float(g.get("lr", 0.0)) for g in groups), default=float("nan")))

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                self.logged.append({"loss": float(logs["loss"]), "grad_norm": logs.get("grad_norm")})

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            moved, still, lora_b = [], [], {}
            with _gathered(self.trainer.model):
                for n, p in self.trainer.model.named_parameters():
                    if n in self.before:
                        delta = float((p.detach().float() - self.before[n].float()).abs().max())
                        (moved if delta > 0 else still).append(n)
                        if "lora_B" in n:
                            lora_b[n] = (float(self.before[n].float().norm()), float(p.detach().float().norm()))
            # The trainer's logged norm (before clipping) where it logs one, else the probe's.
            norms = [float(x["grad_norm"]) for x in self.logged if x.get("grad_norm") is not None] or self.norms
            idle = bool(self.rates) and all(r == 0 for r in self.rates)
            notes = [f"the learning rate was 0 at each of the {len(self.rates)} rehearsed step(s) (a warm-up from 0 "
                     "covers them): whether the parameters move is not judged; rehearse more steps (--steps)"
                     ] if idle else []
            STATE.write("train", "ok", losses=[x["loss"] for x in self.logged], grad_norms=norms,
                        learning_rates=self.rates, notes=notes,
                        trainable=len(self.before), moved=len(moved), unchanged=still[:10],
                        unchanged_count=len(still),
                        lora_b={"count": len(lora_b), "moved": sum(1 for a, b in lora_b.values() if a != b)},
                        steps=state.global_step)
            self.before = {}

    return Probe
