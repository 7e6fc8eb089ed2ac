"""A user's transformers Trainer script, run as it is by `rehearse --launch` (tests/test_rehearse_launch.py).

python train_hf.py REPO_ID [--mask-all | --bad-labels] [--fsdp | --deepspeed DS_JSON] [--bf16] [--modules-to-save]
[--image-text] [--resume] [--save-only-model] [--wrap CLASS] [--rank1-fails-copy] [--pids DIR]: LoRA on the model loaded by repo id, chat rows, evaluation and saving each epoch for 50 epochs,
an output_dir outside the rehearsal's folder. --mask-all: a collator bug that masks every label (no exception, nothing
trained); --bad-labels: a collator bug that cuts the labels one short (the loss crashes at the first step); --bf16:
bf16 weights and bf16 mixed precision; --modules-to-save: the embeddings and the head trained whole beside the adapter
(modules_to_save), at a learning rate of 0.01; --image-text: the model loaded as an image-text-to-text model (Gemma
3's multimodal class), gradient accumulation 2; --resume: train(resume_from_checkpoint=True), as a run restarted after
a stop; --save-only-model: checkpoints hold the weights only (no optimizer or scheduler state); --deepspeed: the
Trainer's own DeepSpeed integration with that JSON (TrainingArguments(deepspeed=...)); --rank1-fails-copy: a loss that
raises on rank 1 only, and only in a Trainer other than the script's own (the rehearsal's copies for the accumulation
check: a failure one rank meets alone, as an out-of-memory on one rank would be); --pids DIR: each rank writes its pid
to DIR/rankN.pid (for a test to see that none outlives the rehearsal). Runs on transformers
4.50 and later (the reproduction venvs of tests/venvs.py).
"""

import os
import sys

import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer,
                          TrainingArguments)

REPO = sys.argv[1]
if "--pids" in sys.argv:
    with open(os.path.join(sys.argv[sys.argv.index("--pids") + 1], f"rank{os.environ.get('RANK', '0')}.pid"), "w") as f:
        f.write(str(os.getpid()))
bf16 = "--bf16" in sys.argv
tok = AutoTokenizer.from_pretrained(REPO)
# from_pretrained's dtype keyword is `dtype` from transformers 4.56, `torch_dtype` before.
dtype_kw = "torch_dtype" if tuple(int(x) for x in transformers.__version__.split(".")[:2]) < (4, 56) else "dtype"
image_text = "--image-text" in sys.argv
loader = transformers.AutoModelForImageTextToText if image_text else AutoModelForCausalLM
model = loader.from_pretrained(REPO, **{dtype_kw: torch.bfloat16 if bf16 else torch.float32})
saved = dict(modules_to_save=["embed_tokens", "lm_head"]) if "--modules-to-save" in sys.argv else {}
model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM",
                                         **saved))
rows = [tok.apply_chat_template([{"role": "user", "content": f"What is {i} plus {i}?"},
                                 {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."}], tokenize=False)
        for i in range(8)]
data = [dict(tok(r, add_special_tokens=False)) for r in rows]


class Collator(DataCollatorForLanguageModeling):
    def __call__(self, features, return_tensors=None):
        batch = super().__call__(features, return_tensors)
        if "--mask-all" in sys.argv:
            batch["labels"][:] = -100
        if "--bad-labels" in sys.argv:
            batch["labels"] = batch["labels"][:, :-1]
        return batch


# --fsdp: the same run sharded over the launched ranks (FSDP, decoder layers wrapped).
# --wrap CLASS: another class to wrap (one the model lacks: accelerate stops at prepare on a GPU).
wrap = sys.argv[sys.argv.index("--wrap") + 1] if "--wrap" in sys.argv else "Gemma3DecoderLayer"
sharded = dict(fsdp="full_shard auto_wrap", fsdp_config={"transformer_layer_cls_to_wrap": [wrap]}) \
    if "--fsdp" in sys.argv else {}
if "--deepspeed" in sys.argv:
    sharded = dict(deepspeed=sys.argv[sys.argv.index("--deepspeed") + 1])
args = TrainingArguments(output_dir="/tmp/gemma-doctor-launch-test-never-written", per_device_train_batch_size=2,
                         learning_rate=1e-2 if saved else 1e-3, num_train_epochs=50, eval_strategy="epoch",
                         save_strategy="epoch", report_to="none", use_cpu=True, bf16=bf16,
                         gradient_accumulation_steps=2 if image_text else 1,
                         save_only_model="--save-only-model" in sys.argv, **sharded)


class RankOneFailsCopies(Trainer):
    def compute_loss(self, model, inputs, *a, **kw):
        if os.environ.get("RANK") == "1" and self is not trainer:
            raise RuntimeError("a failure rank 1 meets alone")
        return super().compute_loss(model, inputs, *a, **kw)


trainer_cls = RankOneFailsCopies if "--rank1-fails-copy" in sys.argv else Trainer
trainer = trainer_cls(model=model, args=args, train_dataset=data[:6], eval_dataset=data[6:],
                  data_collator=Collator(tok, mlm=False))
trainer.train(resume_from_checkpoint=True if "--resume" in sys.argv else None)
trainer.save_model("final")
