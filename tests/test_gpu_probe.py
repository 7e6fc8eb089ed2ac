"""The GPU probe with faked hardware (there is no GPU here): NVML, torch, ROCm sysfs, MPS, and start-up cost."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import types

import pytest

from gemma_doctor.readers import gpu as gpu_reader
from gemma_doctor.readers.gpu import probe, resolve
from tests.builders import HubCache, gemma3_1b_config

GIB = 1024**3


class FakeNvml(types.ModuleType):
    """A pynvml stand-in: devices as (name, (major, minor), memory GiB, uuid)."""

    def __init__(self, devices, fail_init: bool = False) -> None:
        super().__init__("pynvml")
        self.devices = devices
        self.fail_init = fail_init
        self.shutdown_called = False

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shutdown_called = True

    def nvmlSystemGetDriverVersion(self):
        return b"550.54.15"

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self.devices[h][0]

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return self.devices[h][1]

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(total=self.devices[h][2] * GIB)

    def nvmlDeviceGetUUID(self, h):
        return self.devices[h][3] if len(self.devices[h]) > 3 else f"GPU-{h:08d}-aaaa"


def fake_torch(devices, hip: str | None = None, cuda: str | None = "12.4"):
    """A torch stand-in whose is_bf16_supported() lies like the real one (True on any GPU)."""
    props = [types.SimpleNamespace(name=n, major=cc[0], minor=cc[1], total_memory=mem * GIB, gcnArchName=arch)
             for n, cc, mem, arch in devices]
    cuda_ns = types.SimpleNamespace(
        is_available=lambda: bool(devices), device_count=lambda: len(devices),
        get_device_properties=lambda i: props[i],
        is_bf16_supported=lambda including_emulation=True: bool(devices) and (including_emulation or props[0].major >= 8),
    )
    mod = types.ModuleType("torch")
    mod.__version__ = "2.13.0"
    mod.cuda = cuda_ns
    mod.version = types.SimpleNamespace(cuda=cuda, hip=hip)
    return mod


def loader(**modules):
    return lambda name: modules.get(name)


def driver(present: bool):
    return lambda: present


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX search path (Windows asks shutil.which itself)")
def test_nvidia_smi_on_the_search_path_is_found_as_shutil_which_finds_it(tmp_path, monkeypatch):
    """The driver probe's PATH look-up (without importing shutil) agrees with shutil.which on each kind of entry."""
    import shutil

    exe, plain, folder, empty = (tmp_path / n for n in ("exe", "plain", "folder", "empty"))
    for d in (exe, plain, folder, empty):
        d.mkdir()
    (exe / "nvidia-smi").write_text("#!/bin/sh\n")
    (exe / "nvidia-smi").chmod(0o755)
    (plain / "nvidia-smi").write_text("not executable")  # no x bit: not a command
    (folder / "nvidia-smi").mkdir(mode=0o755)  # a folder is never a command, searchable or not
    cases = {str(exe): True, f"{plain}{os.pathsep}{folder}{os.pathsep}{empty}": False, f"{folder}{os.pathsep}{exe}": True,
             "": False}
    for path, found in cases.items():
        monkeypatch.setenv("PATH", path)
        assert gpu_reader.nvidia_driver_present(()) is found, path
        assert (shutil.which("nvidia-smi") is not None) is found, path  # the oracle agrees
    monkeypatch.chdir(exe)
    monkeypatch.setenv("PATH", f"{os.pathsep}{empty}")  # an empty entry is the working folder, for both
    assert gpu_reader.nvidia_driver_present(()) and shutil.which("nvidia-smi") is not None


def test_no_driver_is_a_normal_answer_and_imports_nothing():
    asked: list[str] = []
    facts = probe({}, system="linux", driver_present=driver(False), load=lambda n: asked.append(n))
    assert facts.backend == "none" and facts.devices == () and facts.native_bf16 is False
    assert "no CUDA device" in facts.reason
    assert asked == []  # neither pynvml nor torch was imported


@pytest.mark.parametrize("name,cc,native,trap", [
    ("Tesla T4", (7, 5), False, True), ("Tesla V100-SXM2-16GB", (7, 0), False, True),
    ("NVIDIA A100-SXM4-80GB", (8, 0), True, False), ("NVIDIA H100 80GB HBM3", (9, 0), True, False),
])
def test_nvml_single_gpu(name, cc, native, trap):
    nvml = FakeNvml([(name, cc, 16)])
    facts = probe({}, system="linux", driver_present=driver(True), load=loader(pynvml=nvml))
    assert facts.via == "nvml" and facts.backend == "cuda" and facts.driver == "550.54.15"
    assert facts.native_bf16 is native and facts.emulated_bf16_trap is trap
    assert facts.devices[0].compute_capability == cc and facts.devices[0].memory_bytes == 16 * GIB
    assert nvml.shutdown_called


def test_weakest_gpu_decides():
    nvml = FakeNvml([("NVIDIA A100-SXM4-80GB", (8, 0), 80), ("Tesla T4", (7, 5), 16)])
    facts = probe({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, system="linux", driver_present=driver(True), load=loader(pynvml=nvml))
    assert len(facts.devices) == 2 and facts.native_bf16 is False and facts.emulated_bf16_trap
    assert facts.weakest.name == "Tesla T4"
    assert "weakest" in facts.label


@pytest.mark.parametrize("visible,expected", [
    ("1", ["NVIDIA A100-SXM4-80GB"]), ("0", ["Tesla T4"]), ("0,1", ["Tesla T4", "NVIDIA A100-SXM4-80GB"]),
    ("1,7,0", ["NVIDIA A100-SXM4-80GB"]),  # CUDA stops at the first invalid entry
    ("GPU-00000001", ["NVIDIA A100-SXM4-80GB"]),
    ("1,\u00b2", ["NVIDIA A100-SXM4-80GB"]),  # a non-ASCII digit is an invalid entry (int() refuses it): CUDA stops
])
def test_cuda_visible_devices_is_honoured(visible, expected):
    nvml = FakeNvml([("Tesla T4", (7, 5), 16), ("NVIDIA A100-SXM4-80GB", (8, 0), 80)])
    env = {"CUDA_VISIBLE_DEVICES": visible, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    facts = probe(env, system="linux", driver_present=driver(True), load=loader(pynvml=nvml))
    assert [d.name for d in facts.devices] == expected


@pytest.mark.parametrize("visible", ["", "-1", "none", "\u00b2"])
def test_cuda_visible_devices_hiding_everything(visible):
    nvml = FakeNvml([("NVIDIA A100-SXM4-80GB", (8, 0), 80)])
    facts = probe({"CUDA_VISIBLE_DEVICES": visible}, system="linux", driver_present=driver(True), load=loader(pynvml=nvml))
    assert facts.devices == () and "CUDA_VISIBLE_DEVICES" in facts.reason


def test_mixed_gpus_without_pci_order_ask_torch():
    # CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID; NVML numbers them by PCI bus.
    nvml = FakeNvml([("Tesla T4", (7, 5), 16), ("NVIDIA A100-SXM4-80GB", (8, 0), 80)])
    torch = fake_torch([("NVIDIA A100-SXM4-80GB", (8, 0), 80, None)])
    facts = probe({"CUDA_VISIBLE_DEVICES": "0"}, system="linux", driver_present=driver(True),
                  load=loader(pynvml=nvml, torch=torch))
    assert facts.via == "torch" and facts.native_bf16 is True


def test_nvml_failure_falls_back_to_torch_which_is_never_asked_is_bf16_supported():
    torch = fake_torch([("Tesla T4", (7, 5), 15, None)])
    torch.cuda.is_bf16_supported = lambda including_emulation=True: pytest.fail("is_bf16_supported() was called")
    facts = probe({}, system="linux", driver_present=driver(True), load=loader(pynvml=FakeNvml([], fail_init=True), torch=torch))
    assert facts.via == "torch" and facts.native_bf16 is False and facts.emulated_bf16_trap


def test_driver_without_nvml_or_torch():
    facts = probe({}, system="linux", driver_present=driver(True), load=loader())
    assert facts.native_bf16 is None and "nvidia-ml-py" in facts.reason


def test_cpu_only_torch_build():
    facts = probe({}, system="linux", driver_present=driver(True), load=loader(torch=fake_torch([], cuda=None)))
    assert facts.devices == () and "CPU-only" in facts.reason


def test_rocm_via_torch():
    torch = fake_torch([("AMD Instinct MI300X", (9, 4), 192, "gfx942:sramecc+:xnack-")], hip="6.2", cuda=None)
    facts = probe({}, system="linux", driver_present=driver(True), load=loader(torch=torch))
    assert facts.backend == "rocm" and facts.native_bf16 is True and facts.devices[0].arch == "gfx942"
    assert facts.emulated_bf16_trap is False


def test_rocm_via_sysfs(tmp_path, monkeypatch):
    for node, version in [("0", 0), ("1", 90010), ("2", 90010)]:  # node 0 is the CPU
        (tmp_path / node).mkdir()
        (tmp_path / node / "properties").write_text(f"cpu_cores_count 0\ngfx_target_version {version}\n")
    facts = gpu_reader.probe_kfd({}, nodes_dir=str(tmp_path))
    assert [d.arch for d in facts.devices] == ["gfx90a", "gfx90a"] and facts.native_bf16 is True
    old = gpu_reader.probe_kfd({"HIP_VISIBLE_DEVICES": "0"}, nodes_dir=str(tmp_path))
    assert len(old.devices) == 1


@pytest.mark.parametrize("mac,chip,native,trap", [
    ("14.5", "Apple M1 Pro", False, True), ("14.5", "Apple M2", False, True), ("14.5", "Apple M3 Max", True, False),
    ("13.6", "Apple M3", False, False), ("15.0", "Apple M9", None, False),
])
def test_mps(mac, chip, native, trap):
    facts = gpu_reader.probe_mps(mac, chip)
    assert facts.backend == "mps" and facts.native_bf16 is native and facts.emulated_bf16_trap is trap


def test_probe_never_raises():
    def boom(name):
        raise OSError("weird")
    facts = probe({}, system="linux", driver_present=driver(True), load=boom)
    assert facts.native_bf16 is None and "probe failed" in facts.reason


def test_resolve_plans_with_gpu_spec_without_probing(monkeypatch):
    monkeypatch.setattr(gpu_reader, "probe", lambda *a, **k: pytest.fail("probed although --gpu was given"))
    facts = resolve("T4")
    assert facts.source == "--gpu" and facts.native_bf16 is False and facts.emulated_bf16_trap
    assert facts.devices[0].compute_capability == (7, 5)
    assert resolve("none").backend == "none"


def test_json_shape():
    doc = resolve("A100").to_json()
    assert doc == {"source": "--gpu", "spec": "A100", "backend": "cuda", "via": "--gpu", "driver": None,
                   "native_bf16": True, "emulated_bf16_trap": False, "label": "A100 (sm_80)",
                   "reason": "--gpu A100: A100 (sm_80): native bf16",
                   "devices": [{"index": 0, "name": "A100", "compute_capability": "8.0", "memory_bytes": None,
                                "native_bf16": True, "arch": None}]}


# --- through the CLI ---------------------------------------------------------------------------

@pytest.fixture
def cache(hub: HubCache) -> HubCache:
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    return hub


def test_check_json_has_environment_gpu_from_a_faked_nvml(cli, cache, monkeypatch):
    monkeypatch.setattr(gpu_reader, "nvidia_driver_present", lambda *a: True)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([("Tesla T4", (7, 5), 16)]))
    r = cli("check", "--cache-dir", cache.root, "--format", "json", "--fail-on", "never")
    assert r.code == 0, r
    gpu = r.json()["environment"]["gpu"]
    assert gpu["source"] == "probe" and gpu["via"] == "nvml" and gpu["native_bf16"] is False
    assert gpu["devices"][0]["compute_capability"] == "7.5"


@pytest.mark.parametrize("gpu_option, words", [
    (("--gpu", "RTX 2080 Ti"), ["--gpu", "RTX 2080 Ti"]),  # a name with spaces stays one shell word
    (("--gpu", "T4"), ["--gpu", "T4"]),
    ((), []),  # the GPU came from the probe: the command plans for the GPU found, as check did
])
def test_gd302_fix_command_runs_for_the_same_gpu_as_typed(cli, cache, monkeypatch, gpu_option, words):
    monkeypatch.setattr(gpu_reader, "nvidia_driver_present", lambda *a: True)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([("Tesla T4", (7, 5), 16)]))
    r = cli("check", "google/gemma-3-1b-it", "--cache-dir", cache.root, *gpu_option, "--format", "json",
            "--fail-on", "never")
    gd302 = [f for f in r.json()["models"][0]["findings"] if f["code"] == "GD302"]
    assert len(gd302) == 1, r
    command = gd302[0]["fix"].split(" (fp32 settings)")[0]
    assert shlex.split(command) == ["gemma-doctor", "recommend", "google/gemma-3-1b-it", *words]
    if not any(" " in w for w in words):  # a plain name is printed as typed, unquoted
        assert command == " ".join(["gemma-doctor", "recommend", "google/gemma-3-1b-it", *words])


def test_probe_runs_once_per_run_not_per_model(cli, hub, monkeypatch):
    for i in range(3):
        hub.add(f"google/gemma-3-1b-it-{i}", {"config.json": gemma3_1b_config()})
    calls: list[int] = []
    real = gpu_reader.probe
    monkeypatch.setattr(gpu_reader, "probe", lambda *a, **k: calls.append(1) or real(*a, **k))
    r = cli("check", "--cache-dir", hub.root, "--format", "json", "--fail-on", "never")
    assert r.code == 0 and len(r.json()["models"]) == 3
    assert len(calls) == 1


@pytest.mark.parametrize("value", ["T4", "sm_75", "7.5", "t4", "none", "H100", "rtx 4090"])
def test_check_accepts_gpu_values(cli, cache, value):
    r = cli("check", "--cache-dir", cache.root, "--gpu", value, "--format", "json", "--fail-on", "never")
    assert r.code == 0, r
    assert r.json()["environment"]["gpu"]["source"] == "--gpu"


def test_check_bad_gpu_value_is_a_usage_error(cli, cache):
    r = cli("check", "--cache-dir", cache.root, "--gpu", "T5")
    assert r.code == 2
    assert r.out == ""
    assert len(r.err.strip().splitlines()) == 1 and "sm_75" in r.err


def test_check_on_a_cpu_without_driver_does_not_import_torch(cache, tmp_path):
    if gpu_reader.nvidia_driver_present():
        pytest.skip("this machine has an NVIDIA driver")
    code = (
        "import sys, json\n"
        "from gemma_doctor.cli import main\n"
        "try:\n"
        f"    main(['check', '--cache-dir', {str(cache.root)!r}, '--format', 'json', '--fail-on', 'never'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "sys.stderr.write(json.dumps(sorted(m for m in ('torch', 'transformers', 'pynvml') if m in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""})
    imported = json.loads(proc.stderr.strip().splitlines()[-1])
    assert imported == []
    doc = json.loads(proc.stdout)
    assert doc["environment"]["gpu"]["reason"].startswith("no CUDA device")
