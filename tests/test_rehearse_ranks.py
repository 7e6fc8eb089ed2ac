"""`rehearse TARGET --training-config T --accelerate-config fsdp.yaml`: the twin trained on 2 CPU (gloo) ranks by
torch's launcher, sharded by torch's FSDP as accelerate's own launcher and plugin read the config
(gemma_doctor/rehearse/ranks.py); and a launched 2-rank script whose rank hangs, killed with its process group.

Each 2-rank run is a child of two processes importing the stack (most of its seconds), so there are three, marked
slow. The twin is built once for the module, in this process, and kept (GEMMA_DOCTOR_TWIN_CACHE): every run copies it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gemma_doctor.rehearse import kept
from tests.kept_twins import kept_twin
from tests.test_rehearse import model_folder

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parent / "scripts" / "ranks"
LORA = """\
learning_rate: 0.001
per_device_train_batch_size: 2
use_peft: true
lora_r: 8
lora_target_modules: [q_proj, v_proj]
"""
FSDP = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
mixed_precision: bf16
num_machines: 1
num_processes: 8
fsdp_config:
  fsdp_version: {version}
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: {wrap}
  fsdp_state_dict_type: {state}
  fsdp_offload_params: false
  fsdp_cpu_ram_efficient_loading: true
  fsdp_sync_module_states: true
  fsdp_activation_checkpointing: {checkpointing}
  fsdp_use_orig_params: true
"""


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return model_folder(tmp_path_factory.mktemp("target"), "gemma3_text")


@pytest.fixture(scope="module", autouse=True)
def twins(tmp_path_factory, target) -> Path:
    """The module's twin folder with the twin of ``target`` kept in it, built here by the rehearsal's own builder
    (tests/kept_twins.py)."""
    folder = kept_twin(tmp_path_factory, target, 2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(kept.ENV, str(folder))
        yield folder


def rehearse(cli, target: Path, tmp_path: Path, *, version: int = 1, wrap: str = "Gemma3DecoderLayer",
             state: str = "FULL_STATE_DICT", checkpointing: str = "false", lora: bool = True) -> tuple[int, dict]:
    (tmp_path / "lora.yaml").write_text(LORA if lora else LORA.split("use_peft")[0])
    (tmp_path / "fsdp.yaml").write_text(FSDP.format(version=version, wrap=wrap, state=state,
                                                    checkpointing=checkpointing))
    got = cli("rehearse", target, "--training-config", tmp_path / "lora.yaml", "--accelerate-config",
              tmp_path / "fsdp.yaml", "--steps", "2", "--device", "cpu", "--format", "json")
    return got.code, got.json()["rehearsals"][0]


def test_a_healthy_fsdp2_config_rehearses_on_two_ranks_without_a_finding(cli, target, tmp_path):
    code, doc = rehearse(cli, target, tmp_path, version=2, checkpointing="true", lora=False)
    assert doc["findings"] == [] and code == 0, doc["findings"]
    by_rank = {r: [s["stage"] for s in doc["stages"] if s.get("rank") == r and s["status"] == "ok"] for r in (0, 1)}
    assert by_rank == {0: ["load", "wrap", "train", "agree", "save", "reload"],
                       1: ["load", "wrap", "train", "agree", "save"]}
    wrap = next(s for s in doc["stages"] if s["stage"] == "wrap")
    # the user's settings kept: FSDP2, the wrap class (both decoder layers of the twin), checkpointing, state-dict type
    assert (wrap["version"], wrap["classes"], wrap["wrapped"], wrap["activation_checkpointing"]) == \
        (2, ["Gemma3DecoderLayer"], 2, True) and wrap["state_dict_type"].endswith("FULL_STATE_DICT")
    assert len({s["digest"] for s in doc["stages"] if s["stage"] == "agree"}) == 1
    reload = next(s for s in doc["stages"] if s["stage"] == "reload")
    assert reload["adapter_tensors"] is None and reload["max_abs_diff"] <= 0.05 * reload["scale"]
    # what a CPU cannot do is replaced and said
    assert any("sync_module_states needs an accelerator device" in n for n in doc["notes"])
    assert any("num_processes 8: 2 CPU ranks" in n for n in doc["notes"])


def test_an_fsdp1_lora_run_that_saves_an_empty_adapter_is_found(cli, target, tmp_path):
    """Reproduced on the pinned stack: under FSDP1 (TRL 1.16's own accelerate_configs/fsdp1.yaml) the adapter's module
    names hold _fsdp_wrapped_module. inside them, and PEFT 0.21.2 (tuners_utils._get_tuner_state_dict_key_prefixes)
    strips it only at the front, so save_pretrained(state_dict=full state), as the Trainer saves, writes an
    adapter_model.safetensors without a tensor, silently; the reloaded adapter is a fresh one. (FSDP2 with
    fsdp_activation_checkpointing does the same through _checkpoint_wrapped_module.; FSDP2 without it saves all.)"""
    code, doc = rehearse(cli, target, tmp_path, version=1)
    assert code == 1 and [f["code"] for f in doc["findings"]] == ["GD993"], doc["findings"]
    assert "the adapter saved holds no tensor" in doc["findings"][0]["message"]
    assert "_fsdp_wrapped_module" in doc["findings"][0]["message"] and "FSDP2" in doc["findings"][0]["fix"]


def test_a_launched_fsdp_config_runs_on_two_cpu_ranks_and_a_rank_that_hangs_is_killed_at_the_deadline(
        cli, target, tmp_path, monkeypatch):
    """`accelerate launch --config_file fsdp.yaml --num_processes 8`: the config's device-only settings made
    accelerate stop in every rank's Accelerator() ("no available devices") and 8 ranks were started; the copy for CPU
    ranks replaces them (said in the notes). Rank 1 then hangs: the deadline kills every process of the run."""
    (tmp_path / "fsdp.yaml").write_text(FSDP.format(version=1, wrap="Gemma3DecoderLayer", state="FULL_STATE_DICT",
                                                    checkpointing="false"))
    monkeypatch.chdir(SCRIPTS)
    pids = tmp_path / "pids"
    pids.mkdir()
    got = cli("rehearse", target, "--launch", f"accelerate launch --config_file {tmp_path / 'fsdp.yaml'} "
              f"--num_processes 8 hang.py {pids} --accelerator", "--device", "cpu", "--timeout", "30",
              "--format", "json")
    doc = got.json()["rehearsals"][0]
    assert got.code == 1 and [f["code"] for f in doc["findings"]] == ["GD952"], doc["findings"]
    assert sorted(p.name for p in pids.iterdir()) == ["rank0.pid", "rank1.pid"]
    assert any("sync_module_states needs an accelerator device" in n for n in doc["notes"])
    assert any("MULTI_CPU" in n for n in doc["notes"])
    # torchrun starts each rank in a session of its own: before the child's mark, the hung rank outlived the
    # deadline (an orphan of init, still sleeping)
    assert [p.name for p in pids.iterdir() if running(int(p.read_text()))] == []


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie left to init to reap has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
