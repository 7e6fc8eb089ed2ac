"""Run axolotl's chat_template strategy (the real module, axolotl on PYTHONPATH without its dependencies' stack) on a
Gemma-template tokenizer, with and without eot_tokens; print, per case, the labels of <end_of_turn> as JSON.

Usage: python axolotl_eot.py TOKENIZER_FOLDER"""

import json
import sys

from transformers import AutoTokenizer

from axolotl.prompt_strategies.chat_template import StrategyLoader
from axolotl.utils.dict import DictDefault

tok = AutoTokenizer.from_pretrained(sys.argv[1])
row = {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "the answer is 42"}]}
end = tok.convert_tokens_to_ids("<end_of_turn>")
out = {}
for name, extra in (("default", {}), ("eot_tokens", {"eot_tokens": ["<end_of_turn>"]})):
    cfg = DictDefault({"sequence_len": 64, "train_on_inputs": False, "chat_template": "tokenizer_default", **extra})
    strategy = StrategyLoader()(tok, cfg, {"type": "chat_template", "field_messages": "messages"})
    done = strategy.tokenize_prompt(row)
    ids, labels = done["input_ids"], done["labels"]
    out[name] = {"end_of_turn_labels": [labels[i] for i, t in enumerate(ids) if t == end],
                 "trained": tok.convert_ids_to_tokens([t for t, lab in zip(ids, labels) if lab != -100])}
print(json.dumps(out))
