"""Virtual environments with a pinned transformers, built once and cached, for tests that need one.

The cache folder is $GEMMA_DOCTOR_TEST_VENVS, else .ci-cache/venvs in the repository (git-ignored).
torch 2.13.0 (the CPU build on disk, so nothing pulls CUDA packages) is installed once, into a folder every venv
shares through a .pth file (shared_torch): a venv then holds only its own stack (about 0.3 GB instead of 1.2 GB).
Seven full copies of torch filled the CI machine's disk (ENOSPC, stop 28). pip sees the shared torch as installed,
so nothing reinstalls it; a package a venv pins differently (filelock, typing-extensions, ...) is installed into the
venv and shadows the shared one, since the venv's own site-packages comes first on sys.path.

Most of a build was pip's own work, not the download: installs skip byte-compiling (``--no-compile``: Python writes
the bytecode of the modules a test imports when it first imports them, instead of pip compiling all of transformers
in advance), and a locked venv is one install instead of three pip runs. A locked venv is installed by uv (a test
dependency) from its lock's exact versions without resolving again, and the project from one wheel built once
(project_wheel): two workers then build their venvs at once. What is installed is the same: a locked venv whose
``pip freeze`` is not its lock, or that fails ``pip check``, is not marked complete (ensure_venv); without uv, pip
installs it as before.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCH = "torch==2.13.0"
# transformers 4.50.0 with the accelerate the crash was reported with (facts.md section 1), and the last PEFT
# that leaves LoRA adapters in the base model's half precision (GD401), which installs beside them.
LEGACY = ("transformers==4.50.0", "accelerate==1.5.2", "huggingface_hub<1.0", "peft==0.11.1")
# The project's own light dependencies (pyproject.toml), installed without letting them move the pinned stack.
LIGHT = ("click>=8.1", "rich>=13", "safetensors>=0.4.3", "filelock", "packaging", "numpy", "pyyaml")
# The last transformers 4.x with the last PEFT that still ignores Gemma 3's embed_scale (fixed in 0.18.0): version
# skew (a 5.x-saved config read by 4.x), PEFT's scaled-embedding bug, 4.x loading behaviour.
V4_LATE = ("transformers==4.57.6", "accelerate==1.10.1", "huggingface_hub<1.0", "peft==0.17.1")
# An early 5.x inside several windows at once: Gemma 3's token_type_ids check, Gemma 4's mm_token_type_ids check
# (5.5.0-5.5.4) and Gemma 4's KV sharing without a cache (5.5.0-5.5.1). One venv for all of them keeps CI short.
V5_EARLY = ("transformers==5.5.1", "accelerate==1.13.0", "peft==0.18.1")
# The last transformers before 4.52 moved the multimodal classes' language model (language_model.model.* ->
# model.language_model.*, transformers #38927), with the PEFT of its time: an adapter saved in the new layout loads
# as nothing there (GD760).
V4_PRE_LAYOUT = ("transformers==4.51.3", "accelerate==1.6.0", "huggingface_hub<1.0", "peft==0.15.2")
# The one accelerate whose FSDP2 preparation splits a tied embedding over two FSDP groups, which torch 2.13 refuses
# (GD662; accelerate PR #4171, fixed in 1.15.0), beside the main venv's transformers. Its lock is the test stack's
# every version but accelerate's (tests/test_venvs_lock.py), so the suite runs it as the main interpreter with
# ACCEL_FSDP2_TIED_PACKAGES first on PYTHONPATH (ensure_packages: one wheel) instead of building the venv;
# benchmarks/field_recall.py reads its lock.
ACCEL_FSDP2_TIED = ("transformers==5.23.0", "accelerate==1.14.0")
ACCEL_FSDP2_TIED_PACKAGES = ("accelerate==1.14.0",)


CONSTRAINTS = ROOT / "tests" / "constraints.txt"


def pinned(name: str, constraints: Path = CONSTRAINTS) -> str:
    """The version of ``name`` the test stack pins (tests/constraints.txt), e.g. ``pinned("transformers")``."""
    want = name.lower().replace("_", "-")
    for line in constraints.read_text().splitlines():
        spec = line.split("#", 1)[0].strip()
        if "==" in spec:
            pkg, version = (part.strip() for part in spec.split("==", 1))
            if pkg.lower().replace("_", "-") == want:
                return version
    raise KeyError(f"{name} is not pinned in {constraints}")


def venv_root() -> Path:
    """Where built venvs are kept between runs."""
    return Path(os.environ.get("GEMMA_DOCTOR_TEST_VENVS") or ROOT / ".ci-cache" / "venvs")


LOCKS = ROOT / "tests" / "venv-locks"


def lock_file(packages: tuple[str, ...]) -> Path:
    """The lock of the venv built for ``packages`` (tests/venv-locks/NAME.txt, NAME from its pins): every package it
    holds, exact, so that a release of a dependency tomorrow builds the same venv."""
    name = "_".join(p.replace("==", "-").replace("<", "lt").replace(">", "gt").replace("=", "") for p in packages)
    return LOCKS / f"{name}.txt"


def _pip(python: str | Path) -> list[str]:
    """The pip command line every build uses: quiet, no cache (the wheels are installed once, into the cached folder),
    and without byte-compiling (Python writes the bytecode of what a test imports, on its first import)."""
    return [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-cache-dir", "--no-compile"]


def _built_once(name: str, command: list[str]) -> Path:
    """venv_root()/``name``, filled once by ``command`` (which names the folder itself) under a lock, so pytest-xdist
    workers or parallel sessions build it once; a half-built one (no .complete) is built again."""
    root = venv_root()
    root.mkdir(parents=True, exist_ok=True)
    folder = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".complete").exists():
            if folder.exists():
                shutil.rmtree(folder)
            subprocess.run(command, check=True)
            (folder / ".complete").write_text("ok\n")
    return folder


def _pip_target(prefix: str, keyed: tuple[str, ...], pip_args: tuple[str, ...]) -> Path:
    """A folder filled once by ``pip install --target`` with ``pip_args`` (the main interpreter's pip), cached under
    venv_root() by ``keyed`` and this Python's version."""
    name = f"{prefix}-{hashlib.sha256(chr(10).join((sys.version.split()[0], *keyed)).encode()).hexdigest()[:12]}"
    return _built_once(name, [*_pip(sys.executable), "--target", str(venv_root() / name), *pip_args])


def shared_torch() -> Path:
    """The folder holding torch 2.13.0 and its dependencies, built once per cache; the versions of torch's
    dependencies are the pinned test stack's (tests/constraints.txt)."""
    return _pip_target("torch", (TORCH, CONSTRAINTS.read_text()), ("-c", str(CONSTRAINTS), TORCH))


def ensure_packages(packages: tuple[str, ...]) -> Path:
    """A folder holding exactly ``packages`` (``--no-deps``), built once and cached: for running one module of a
    package whose full install would drag in a stack of its own (axolotl pins gradio, modal, wandb, ...) beside the
    main venv's libraries, on PYTHONPATH."""
    return _pip_target("pkgs", packages, ("--no-deps", *packages))


def project_wheel() -> Path:
    """The project's wheel, built once per cache and source (pyproject.toml and gemma_doctor/), for every venv to install.

    ``pip install <checkout>`` builds in the working tree's build/ folder: two venvs built at once (two xdist workers)
    collided there ("File exists: build/bdist.linux-x86_64/wheel/...dist-info"), and serialising those pip runs held
    one venv's whole install back behind the other's. One wheel, built under a lock, lets the venvs install at once."""
    sources = [ROOT / "pyproject.toml", *sorted(p for p in (ROOT / "gemma_doctor").rglob("*")
                                                 if p.is_file() and "__pycache__" not in p.parts)]
    digest = hashlib.sha256(sys.version.split()[0].encode())
    for source in sources:
        digest.update(str(source.relative_to(ROOT)).encode() + b"\0" + source.read_bytes() + b"\0")
    name = f"wheel-{digest.hexdigest()[:12]}"
    folder = _built_once(name, [sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
                                "--no-cache-dir", "--no-deps", "-w", str(venv_root() / name), str(ROOT)])
    (wheel,) = folder.glob("gemma_doctor-*.whl")
    return wheel


def _uv() -> str | None:
    """The uv binary of the test stack (tests/constraints.txt), or None where this interpreter has none (pip builds)."""
    try:
        from uv import find_uv_bin
    except ImportError:
        return None
    return find_uv_bin()


def _new_venv(path: Path) -> None:
    """An empty venv at ``path`` holding what ``python -m venv --clear`` puts there: the interpreter's bundled pip (and
    setuptools, on Pythons that bundle it), at the bundled versions.

    ``python -m venv`` installs those through ensurepip, which runs pip in a child and byte-compiles all of pip: 8 s of a
    venv's build on a quiet machine, 28-33 s at load 12-13 (seven venvs a CI run). uv installs the same bundled wheels,
    offline, without compiling: 1.2-1.4 s at that load (docs/ci.md); ``pip freeze --all`` of the two is identical (the
    dist-info's INSTALLER and RECORD differ). Without uv, or where this Python bundles no wheels (a distribution's
    ensurepip that installs from elsewhere), ``python -m venv`` builds it as before."""
    import ensurepip

    bundled = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("*.whl"))
    uv = _uv()
    if uv is None or not bundled:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True)
        return
    subprocess.run([sys.executable, "-m", "venv", "--clear", "--without-pip", str(path)], check=True)
    # Named by version from the bundled folder alone (--no-index): installed from a path, pip freeze would name the path.
    wanted = ["==".join(wheel.name.split("-")[:2]) for wheel in bundled]
    subprocess.run([uv, "pip", "install", "--quiet", "--python", str(path / "bin" / "python"), "--no-deps", "--no-index",
                    "--find-links", str(bundled[0].parent), "--cache-dir", str(venv_root() / "uv-cache"), *wanted],
                   check=True)


def _pin(line: str) -> tuple[str, str]:
    """A lock line ``name==version`` as (normalised name, version without torch's local ``+cpu``)."""
    from packaging.utils import canonicalize_name

    name, version = line.split("==", 1)
    return canonicalize_name(name), version.strip().replace("+cpu", "")


def _distributions(folder: Path) -> set[tuple[str, str]]:
    """Every distribution installed in ``folder``, as _pin gives a lock line."""
    from importlib.metadata import distributions

    return {_pin(f"{d.metadata['Name']}=={d.version}") for d in distributions(path=[str(folder)])}


def _lock_covers(lock: list[str], specs: tuple[str, ...], lock_path: Path) -> None:
    """Refuse a lock that does not satisfy every package asked for (a pin or a light dependency changed since --lock):
    installed without resolving, it would build a venv of other versions than the ones asked for."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = dict(_pin(line) for line in lock)
    for spec in specs:
        wanted = Requirement(spec)
        have = pins.get(canonicalize_name(wanted.name))
        if have is None or not wanted.specifier.contains(have, prereleases=True):
            raise RuntimeError(f"the lock {lock_path.name} does not satisfy {spec} (it has {have}; after a deliberate "
                               "change: python -m tests.venvs --lock)")


def _site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


def ensure_venv(packages: tuple[str, ...] = LEGACY, with_project: bool = True) -> Path:
    """Build (or reuse) a venv holding torch 2.13.0 + ``packages`` (+ this project); return its python.

    Installs are constrained by the venv's lock (tests/venv-locks) when there is one; ``python -m tests.venvs
    --lock`` writes the locks of the venvs already built."""
    lock_path = lock_file(packages)
    pinned_text = lock_path.read_text() if lock_path.exists() else ""
    torch_dir = shared_torch()
    key = hashlib.sha256("\n".join((TORCH, str(torch_dir), *packages, *LIGHT, str(with_project), pinned_text))
                         .encode()).hexdigest()[:12]
    root = venv_root()
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"venv-{key}"
    python = path / "bin" / "python"
    marker = path / ".complete"
    with open(root / f"venv-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # pytest-xdist workers or parallel sessions build it once
        if marker.exists():
            return python
        _new_venv(path)
        (_site_packages(python) / "_gemma_doctor_shared_torch.pth").write_text(f"{torch_dir}\n")
        pip = _pip(python)
        project = (str(project_wheel()),) if with_project else ()
        pins = sorted((line for line in pinned_text.splitlines() if line and not line.startswith("#")), key=str.lower)
        uv = _uv()
        if pins and uv:
            # The lock is the whole resolution already (pip's, frozen by --lock): uv installs exactly its wheels, in
            # parallel and without resolving again, less what the shared torch folder holds at the same version (uv,
            # unlike pip, does not see a .pth folder as installed). Its cache sits beside the venvs, so a wheel two
            # venvs share is downloaded once, and the venvs' files are hard links into it (uv's default here).
            _lock_covers(pins, (*packages, *(LIGHT if with_project else ())), lock_path)
            shared = _distributions(torch_dir)
            wanted = [line for line in pins if _pin(line) not in shared]
            # The venv's own setuptools (65.5.0, from venv's ensurepip) shadows the shared folder's, which torch needs
            # (>=77.0.3): pip's resolution installed the shared version into the venv, so this build does too. A lock
            # leaves setuptools out (pip freeze does), so only `pip freeze --all` sees the difference.
            own = dict(_distributions(_site_packages(python)))
            wanted += [f"{name}=={version}" for name, version in sorted(shared) if own.get(name, version) != version]
            subprocess.run([uv, "pip", "install", "--quiet", "--python", str(python), "--no-deps",
                            "--cache-dir", str(root / "uv-cache"), *wanted, *project], check=True)
        elif pins:
            # The lock names every package exactly, so nothing can move the pinned stack: one resolution and one
            # install instead of three pip runs (the project's own dependencies are in the lock too).
            subprocess.run([*pip, "-c", str(lock_path), *packages, *((*LIGHT, *project) if with_project else ())],
                           check=True)
        else:
            # No lock yet: the stack is resolved alone, then the project and its light dependencies beside it.
            subprocess.run([*pip, *packages], check=True)
            if with_project:
                subprocess.run([*pip, "--no-deps", *project], check=True)
                subprocess.run([*pip, *LIGHT], check=True)
        (path / ".packages").write_text("\n".join(packages) + "\n")
        if pinned_text:
            # The build's shortcuts (one pip run, no byte-compiling) must not change what is installed: a venv that is
            # not exactly its lock is not marked complete, so the next test that needs it builds it again (a deliberate
            # change, say a new light dependency, is frozen into the lock by --lock, which reads .packages).
            frozen = _frozen(python)
            if frozen != pins:
                raise RuntimeError(f"{path} is not its lock {lock_path.name} (after a deliberate change: python -m "
                                   f"tests.venvs --lock): {sorted(set(frozen) ^ set(pins))}")
            # Installed without resolving (uv --no-deps): every requirement of what is there must be met, as pip's
            # resolution made it (the lock omits setuptools, which torch needs at >=77.0.3).
            checked = subprocess.run([str(python), "-m", "pip", "check", "--disable-pip-version-check"],
                                     capture_output=True, text=True)
            if checked.returncode:
                raise RuntimeError(f"{path}: pip check: {checked.stdout.strip()}")
        marker.write_text("ok\n")
    return python


def ensure_light_venv() -> Path:
    """A venv as the README's own install leaves it (``pip install -e .``): the project's dependencies only, no torch,
    no transformers; the versions the test stack pins (tests/constraints.txt). Built once and cached; return its python.
    The project itself runs from this working tree (subprocess_env's PYTHONPATH)."""
    deps = ("click>=8.1", "rich>=13.0", "huggingface_hub>=0.24", "safetensors>=0.4.3", "packaging>=21.0", "numpy>=1.24",
            "pyyaml>=6")
    key = hashlib.sha256("\n".join((sys.version.split()[0], *deps, CONSTRAINTS.read_text())).encode()).hexdigest()[:12]
    root = venv_root()
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"light-{key}"
    python = path / "bin" / "python"
    with open(root / f"light-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # pytest-xdist workers or parallel sessions build it once
        if not (path / ".complete").exists():
            _new_venv(path)
            uv = _uv()
            if uv:
                # The same resolution (every package pinned by the constraints) by uv: 5.6 s from an empty uv cache
                # against pip's 27.6 s at load 9-10, its downloads in the uv cache the locked venvs share; pip freeze
                # --all is identical.
                subprocess.run([uv, "pip", "install", "--quiet", "--python", str(python), "--cache-dir",
                                str(root / "uv-cache"), "-c", str(CONSTRAINTS), *deps], check=True)
            else:
                subprocess.run([*_pip(python), "-c", str(CONSTRAINTS), *deps], check=True)
            (path / ".complete").write_text("ok\n")
    return python


def _frozen(python: Path) -> list[str]:
    """A venv's packages as its lock lists them: ``pip freeze`` without the project, torch's local ``+cpu`` dropped."""
    frozen = subprocess.run([str(python), "-m", "pip", "freeze", "--exclude-editable", "--disable-pip-version-check"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    return sorted((line.replace("+cpu", "") for line in frozen
                   if "==" in line and not line.lower().startswith(("gemma-doctor", "gemma_doctor"))), key=str.lower)


def write_locks() -> list[Path]:
    """Freeze every complete venv under venv_root() into its lock file (run after a deliberate change of a venv)."""
    written = []
    for marker in sorted(venv_root().glob("venv-*/.packages")):
        packages = tuple(marker.read_text().split())
        python = marker.parent / "bin" / "python"
        lines = _frozen(python)
        path = lock_file(packages)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# The venv of tests/venvs.py for {' '.join(packages)}: every package, exact "
                        "(python -m tests.venvs --lock).\n" + "\n".join(lines) + "\n")
        written.append(path)
    return written


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for running this working tree's gemma_doctor inside a built venv (PYTHONPATH wins
    over whatever copy the venv installed), offline, without colour."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update({"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "TOKENIZERS_PARALLELISM": "false"})
    env.update(extra)
    return env


# LLaMA-Factory 0.9.5's own window (its metadata: transformers>=4.55,<=5.6.0, trl<=0.24, peft<=0.18.1,
# datasets<=4.0.0, accelerate<=1.11.0), newest inside it, for rehearsing `llamafactory-cli train` (issue 34). Its
# other requirements (gradio, modelscope, av, ...) serve the web UI, the API and media: LLaMA-Factory itself goes in
# with no dependencies (LLAMAFACTORY_PACKAGES) beside this stack and omegaconf, what its train path imports.
LLAMAFACTORY_STACK = ("transformers==5.6.0", "trl==0.24.0", "peft==0.18.1", "datasets==4.0.0", "accelerate==1.11.0",
                      "omegaconf==2.3.0")
# torchaudio: LLaMA-Factory's data/mm_plugin.py imports it at the top (its train path calls it only for audio rows). No
# torchaudio is built for torch 2.13 (PyPI's newest, 2.11.1, is built for torch 2.11.1), so its Python package goes in
# without its compiled extension, which torchaudio supports (its _extension/utils.py: "False if the library file is not
# found"); torch 2.13 cannot load the 2.11.1 libraries.
LLAMAFACTORY_PACKAGES = ("llamafactory==0.9.5", "torchaudio==2.11.1")


# DeepSpeed beside the pinned stack, for rehearsing a DeepSpeed run on 2 CPU ranks (issue 34): DeepSpeed itself with no
# dependencies (its torch, pydantic, numpy, packaging, psutil and tqdm are the main venv's) and the small ones its
# import and JIT build need (hjson, py-cpuinfo, msgpack, einops; ninja for torch's cpp_extension), each exact.
DEEPSPEED_PACKAGES = ("deepspeed==0.19.8", "hjson==3.1.0", "ninja==1.13.2", "py-cpuinfo==9.0.0", "msgpack==1.2.4",
                      "einops==0.8.2")


def ensure_deepspeed() -> Path:
    """The folder holding DeepSpeed and its small dependencies (DEEPSPEED_PACKAGES), built once and cached, for the main
    venv's PYTHONPATH; its bin/ holds the `ninja` torch's JIT build runs."""
    return ensure_packages(DEEPSPEED_PACKAGES)


def ensure_llamafactory() -> tuple[Path, Path]:
    """(the python of LLaMA-Factory's stack venv, the folder holding LLaMA-Factory and torchaudio for its PYTHONPATH),
    built once and cached; LLaMA-Factory runs as ``python -m llamafactory.cli`` there."""
    python = ensure_venv(LLAMAFACTORY_STACK)
    packages = ensure_packages(LLAMAFACTORY_PACKAGES)
    for library in (packages / "torchaudio" / "lib").glob("*.so"):
        library.unlink(missing_ok=True)  # idempotent: the folder is shared by every run of the cache
    return python, packages


if __name__ == "__main__":
    if sys.argv[1:] != ["--lock"]:
        sys.exit("usage: python -m tests.venvs --lock   (writes tests/venv-locks/ from the venvs already built)")
    for written in write_locks():
        print(written.relative_to(ROOT))
