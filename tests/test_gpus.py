"""--gpu parsing and the known-GPU table (pure: no machine is touched)."""

from __future__ import annotations

import pytest

from gemma_doctor.errors import UsageError
from gemma_doctor.gpus import KNOWN_GPUS, emulation_trap, lookup, parse_gpu_spec

# facts.md section 3: native bf16 needs compute capability >= 8.0.
TABLE = [
    ("T4", (7, 5), False), ("V100", (7, 0), False), ("RTX 2080 Ti", (7, 5), False),
    ("A100", (8, 0), True), ("A10G", (8, 6), True), ("A10", (8, 6), True), ("RTX 3090", (8, 6), True),
    ("L4", (8, 9), True), ("L40S", (8, 9), True), ("RTX 4090", (8, 9), True),
    ("H100", (9, 0), True), ("H200", (9, 0), True), ("B200", (10, 0), True), ("RTX 5090", (12, 0), True),
]


@pytest.mark.parametrize("name,cc,native", TABLE)
def test_known_names_have_the_published_compute_capability(name, cc, native):
    for spelling in (name, name.lower(), name.upper(), f"NVIDIA {name}"):
        plan = parse_gpu_spec(spelling)
        assert plan.backend == "cuda"
        assert plan.compute_capability == cc
        assert plan.native_bf16 is native


@pytest.mark.parametrize("text,cc,native", [
    ("8.0", (8, 0), True), ("7.5", (7, 5), False), ("sm_75", (7, 5), False), ("sm75", (7, 5), False),
    ("sm_80", (8, 0), True), ("sm_90a", (9, 0), True), ("sm_100", (10, 0), True), ("sm_120", (12, 0), True),
    ("12.0", (12, 0), True), ("7.0", (7, 0), False), (" 8.6 ", (8, 6), True),
])
def test_compute_capability_forms(text, cc, native):
    plan = parse_gpu_spec(text)
    assert (plan.backend, plan.compute_capability, plan.native_bf16) == ("cuda", cc, native)


@pytest.mark.parametrize("reported,expected", [
    ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA H100 80GB HBM3", "H100"), ("Tesla T4", "T4"),
    ("Tesla V100-SXM2-16GB", "V100"), ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("NVIDIA H100 NVL", "H100"),
    ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"), ("NVIDIA A10G", "A10G"),
])
def test_driver_reported_names_resolve(reported, expected):
    assert lookup(reported).name == expected


@pytest.mark.parametrize("text", ["none", "NONE", "cpu"])
def test_none_plans_for_no_gpu(text):
    plan = parse_gpu_spec(text)
    assert plan.backend == "none" and plan.native_bf16 is False and plan.label == "no GPU"


def test_non_cuda_entries():
    assert parse_gpu_spec("MI300X").backend == "rocm" and parse_gpu_spec("MI300X").native_bf16 is True
    assert parse_gpu_spec("M2").backend == "mps" and parse_gpu_spec("M2").native_bf16 is False
    assert parse_gpu_spec("M3").native_bf16 is True


@pytest.mark.parametrize("text", ["T5", "foo", "", "99.0", "sm_7", "75", "RTX 409", "2.0"])
def test_bad_values_are_one_line_usage_errors_listing_accepted_forms(text):
    with pytest.raises(UsageError) as e:
        parse_gpu_spec(text)
    msg = str(e.value)
    assert "\n" not in msg
    assert "compute capability" in msg and "T4" in msg and "none" in msg


def test_close_misspelling_gets_a_suggestion():
    with pytest.raises(UsageError, match="did you mean RTX 4090"):
        parse_gpu_spec("RTX 409")


def test_every_cuda_entry_has_a_capability_and_names_are_unique():
    seen: set[str] = set()
    for gpu in KNOWN_GPUS:
        assert gpu.backend in ("cuda", "rocm", "mps")
        if gpu.backend == "cuda":
            assert gpu.compute_capability is not None
        for n in (gpu.name, *gpu.aliases):
            assert lookup(n) is gpu
            assert n.lower() not in seen
            seen.add(n.lower())


def test_emulation_trap():
    # torch.cuda.is_bf16_supported() says True on any CUDA GPU (emulation) and on every ROCm build.
    assert emulation_trap("cuda", False) is True
    assert emulation_trap("cuda", True) is False
    assert emulation_trap("rocm", None) is True
    assert emulation_trap("rocm", True) is False
    assert emulation_trap("none", False) is False


# --- one parse of --gpu, whichever command reads it (issue 32) ------------------------------------------------------

SPELLINGS = ["A100", "a100", "A100-80GB", "sm_80", "8.0", "T4", "Tesla T4", "rtx 4090", "MI300X", "none", "cpu"]


@pytest.fixture(scope="module")
def one_model(tmp_path_factory):
    from tests.builders import HubCache, gemma3_12b_config, generation_config

    root = tmp_path_factory.mktemp("gpu-spellings") / "hub"
    HubCache(root).add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config(),
                                                 "generation_config.json": generation_config()})
    return root


@pytest.mark.parametrize("spec", SPELLINGS)
def test_a_gpu_spelling_is_one_value_whichever_command_reads_it(cli, one_model, spec):
    """`--gpu` is parsed once, by readers/gpu.py, into one GpuFacts (kind, memory, the note on the size assumed) that
    every reader takes: check and recommend state the same GPU, plan against the same memory and say the same
    assumption about it, and both equal the reader's own value."""
    import json

    from gemma_doctor.readers import gpu as gpu_reader

    target = ("google/gemma-3-12b-it", "--cache-dir", one_model, "--gpu", spec, "--format", "json")
    checked = json.loads(cli("check", *target, "--fail-on", "never").out)
    recommended = json.loads(cli("recommend", *target).out)
    facts = gpu_reader.resolve(spec)
    assert checked["environment"]["gpu"] == recommended["gpu"] == facts.to_json()
    cm, rm = checked["models"][0]["memory"], recommended["models"][0]["memory"]
    assert (cm["gpu_bytes"], cm["gpu"]) == (rm["gpu_bytes"], rm["gpu"])
    assert cm["gpu_bytes"] == (facts.devices[0].memory_bytes or facts.assumed_memory_bytes if facts.devices else None)
    notes = [a for a in cm["assumptions"] if facts.memory_note and a == facts.memory_note]
    assert notes == [a for a in rm["assumptions"] if facts.memory_note and a == facts.memory_note]
    assert bool(notes) == bool(facts.memory_note)


@pytest.mark.parametrize("spec", SPELLINGS)
def test_the_python_api_judges_by_the_gpu_check_judges_by(spec):
    """The Python API (precision_problems, prepare) and check's training-config lint read a --gpu spelling through
    readers/gpu.py's one value, so they name and judge the same GPU (issue 32: on main the API parsed the spec itself
    and called an MI300X "MI300X" where check said "MI300X (gfx942)")."""
    from gemma_doctor import api, pipeline
    from gemma_doctor.facts import CheckOptions
    from gemma_doctor.readers import gpu as gpu_reader
    from gemma_doctor.rules import training

    options = CheckOptions(gpu=spec)
    env = pipeline.environment(options)
    assert env.gpu == gpu_reader.resolve(spec)
    assert api._gpu(spec) == training.fallback_gpu(spec) == training.gpu_view(env, options)


ACCELERATE = "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_machines: 2\nnum_processes: 8\n"


@pytest.mark.parametrize("num_gpus, config, count, nodes", [
    (None, None, 1, 1),  # --gpu A100: one device planned
    (4, None, 4, 1),  # --num-gpus
    (None, ACCELERATE, 8, 2),  # the training config's num_processes and num_machines
    (2, ACCELERATE, 2, 2),  # the option first, as the run's resolver takes it
])
def test_the_gpu_value_carries_the_runs_count_and_nodes(one_model, tmp_path, num_gpus, config, count, nodes):
    """The GPU value states how many GPUs the run uses and on how many machines, and the memory plan's run (the one
    every view states) uses that very count and those nodes."""
    from gemma_doctor import locate, pipeline
    from gemma_doctor.facts import CheckOptions
    from gemma_doctor.plan.runplan import MemoryRequest
    from gemma_doctor.report import FailOn

    path = None
    if config is not None:
        path = tmp_path / "accelerate.yaml"
        path.write_text(config, encoding="utf-8")
    options = CheckOptions(gpu="A100", fail_on=FailOn.NEVER, training_config=str(path) if path else None,
                           memory=MemoryRequest(num_gpus=num_gpus) if num_gpus else None)
    env = pipeline.environment(options)
    gpu = env.gpu
    assert (gpu.count, gpu.num_nodes) == (count, nodes)
    models, _ = pipeline.select(locate.resolve(["google/gemma-3-12b-it"], one_model, "main", False), explicit=True)
    j = pipeline.judged(models[0], options, env)
    run = j.memory.plan.settings
    assert (run.num_gpus, run.num_nodes) == (gpu.count, gpu.num_nodes)
    hardware = j.facts.run.hardware  # the Run the rules read states the same
    assert (hardware.count.value, hardware.nodes.value) == (gpu.count, gpu.num_nodes)


@pytest.mark.parametrize("text, name, count", [("2xA100", "A100", 2), ("8 x H100", "H100", 8), ("4*T4", "T4", 4),
                                               ("A100-80GB x 2", "A100-80GB", 2), ("L4x4", "L4", 4)])
def test_a_count_in_the_gpu_name_points_to_num_gpus(text, name, count):
    """`--gpu 2xA100` was answered "did you mean A100?": followed, that plans one GPU, not the two the user has. The
    count is its own option: the message says so, with both values."""
    with pytest.raises(UsageError) as caught:
        parse_gpu_spec(text)
    assert f"--gpu {name} --num-gpus {count}" in str(caught.value) and "did you mean" not in str(caught.value)
