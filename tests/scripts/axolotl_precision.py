"""Run axolotl's own config path (validate_config, then normalize_config: the real modules, axolotl on PYTHONPATH without
its dependencies' stack) on configs that set bf16 / fp16 or leave them unset, as on a GPU whose
is_torch_bf16_gpu_available() says True and one where it says False; print, per case, the bf16 / fp16 the trainer
runs with and the torch_dtype it loads the model in, as JSON.

With a third argument, MPS_CASES_JSON, those cases are run next with axolotl's choose_device given the device it picks
on a Mac (torch.backends.mps.is_available(): "mps"; this machine has none), and each of their keys ends in "|mps"; every
case is validated and normalised from its own settings.

Usage: python axolotl_precision.py MODEL_FOLDER CASES_JSON [MPS_CASES_JSON] (each {name: settings})"""

import json
import sys

import axolotl.utils.config as config
from axolotl.utils.dict import DictDefault

folder = sys.argv[1]
out = {}


def run(cases, mps):
    for gpu_bf16 in (True, False):
        # The answer of transformers' is_torch_bf16_gpu_available() on the training GPU (this machine has none).
        config.is_torch_bf16_gpu_available = lambda answer=gpu_bf16: answer
        caps = {"bf16": gpu_bf16, "fp8": False, "n_gpu": 1, "n_node": 1,
                "compute_capability": "sm_80" if gpu_bf16 else "sm_75"}
        for name, settings in cases.items():
            cfg = DictDefault({"base_model": folder, "micro_batch_size": 1, "gradient_accumulation_steps": 1,
                               "learning_rate": 1e-4, "num_epochs": 1, "datasets": [{"path": "x", "type": "alpaca"}],
                               "output_dir": folder + "-out", **settings})
            cfg = config.validate_config(cfg, capabilities=caps, env_capabilities={"torch_version": "2.13.0"})
            config.normalize_config(cfg)
            out[f"{name}|{gpu_bf16}" + ("|mps" if mps else "")] = {
                "bf16": cfg.bf16 is True, "fp16": cfg.fp16 is True,
                "torch_dtype": str(cfg.torch_dtype).replace("torch.", "")}


run(json.loads(sys.argv[2]), False)
if len(sys.argv) > 3:
    def on_a_mac(cfg):
        # choose_device's answer where CUDA is absent and torch.backends.mps.is_available() (one process: world size 1)
        cfg.device = "mps"
        cfg.device_map = cfg.device_map or "auto"

    config.choose_device = on_a_mac
    run(json.loads(sys.argv[3]), True)
print(json.dumps(out))
