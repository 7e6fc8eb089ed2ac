"""FSDP2 on a tied-embedding Gemma (GD662) through accelerate's own fsdp2_prepare_model, on CPU: 2 processes, gloo.
Prints one JSON object: the installed accelerate and torch, and per rank "ok" or the error of the first forward.

Usage: python fsdp2_tied.py

accelerate only selects FSDP for GPU-like devices (state.py: a CPU run stays MULTI_CPU), so the script builds a real
Accelerator on the gloo process group and hands its state the FSDP2 plugin the launcher would have set, then calls
accelerate.utils.fsdp_utils.fsdp2_prepare_model, the function Accelerator.prepare calls for FSDP2.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import warnings

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

WORLD = 2


def rank_main(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD))
    import transformers as T
    from accelerate import Accelerator, FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    torch.distributed.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(0)
        config = T.Gemma3TextConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                    max_position_embeddings=128, pad_token_id=0, eos_token_id=1, bos_token_id=2)
        model = T.Gemma3ForCausalLM(config)
        tied = model.get_input_embeddings().weight is model.get_output_embeddings().weight
        accelerator = Accelerator(cpu=True)
        accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
            transformer_cls_names_to_wrap=["Gemma3DecoderLayer"], reshard_after_forward=True)
        try:
            model = fsdp2_prepare_model(accelerator, model)
            ids = torch.randint(3, 256, (2, 8))
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            result = {"tied": tied, "result": "ok", "loss": float(loss)}
        except Exception as e:  # noqa: BLE001 - the error is the result
            result = {"tied": tied, "result": f"{type(e).__name__}: {e}".splitlines()[0]}
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        torch.distributed.destroy_process_group()


def main() -> None:
    import accelerate

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(rank_main, args=(port, out), nprocs=WORLD, join=True)
        ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(WORLD)]
    print(json.dumps({"accelerate": accelerate.__version__, "torch": torch.__version__, "ranks": ranks}))


if __name__ == "__main__":
    sys.exit(main())
