"""A script that loads the model by repo id and exits without building a Trainer (a custom loop's start)."""

import sys

from transformers import AutoModelForCausalLM

print(type(AutoModelForCausalLM.from_pretrained(sys.argv[1])).__name__)
