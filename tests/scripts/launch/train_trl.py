"""A user's TRL SFTTrainer script, run as it is by `rehearse --launch` (tests/test_rehearse_launch.py): chat rows,
LoRA by peft_config, bf16 (written for a GPU), evaluation configured. python train_trl.py REPO_ID"""
import sys

from datasets import Dataset
from peft import LoraConfig
from trl import SFTConfig, SFTTrainer

REPO = sys.argv[1]
rows = [{"messages": [{"role": "user", "content": f"What is {i} plus {i}?"},
                      {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."}]} for i in range(8)]
args = SFTConfig(output_dir="out", per_device_train_batch_size=2, learning_rate=1e-3, max_length=128,
                 eval_strategy="steps", eval_steps=100, report_to="none", bf16=True)
trainer = SFTTrainer(model=REPO, args=args, train_dataset=Dataset.from_list(rows[:6]),
                     eval_dataset=Dataset.from_list(rows[6:]),
                     peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
trainer.train()
