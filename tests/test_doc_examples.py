"""Every shell example in README.md and docs/*.md that runs gemma-doctor is run, and its shown output checked.

Fenced ```bash / ```sh / ```console / ```text blocks are read; in console/text blocks a command starts with
``$ ``, and the lines after it are its output as the doc shows it. Commands that are not gemma-doctor (pip,
hf download, python) are the reader's set-up: the test provides their effect instead (a hub cache holding the
bundled google/gemma-3-12b-it example and a small google/gemma-3-1b-it, the training configs the examples name).

What is checked, per gemma-doctor command:
- it ends with the exit code the doc shows (``$ echo $?``), else with 0 or 1 (never a usage or internal error);
- each output line the doc shows appears in the real output (whitespace collapsed, so wrapping is free; ``...``
  or ``…`` elide; the test's cache prints as ``~/.cache/huggingface/hub`` and its local Hub as huggingface.co).

A marker on the line before the fence says how to run a block:
- ``<!-- doc-test: hub -->``: the repo is not cached; a local Hub serves the example (gated; the token has access)
- ``<!-- doc-test: hub, no token -->``: the same without a token
- ``<!-- doc-test: skip: REASON -->``: not run (the reason is required)
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

from tests.builders import HubCache, gemma3_1b_config, generation_config

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "reference.md")]
FENCE = re.compile(r"(?:^<!-- doc-test: (?P<mark>[^>]*?) -->\n)?^```(?P<lang>\w*)\n(?P<body>.*?)^```", re.M | re.S)
SHELL_LANGS = {"bash", "sh", "shell", "console", "text"}
TOKEN = "hf_reader_of_the_docs"
HOME_CACHE = "~/.cache/huggingface/hub"


@dataclass
class Command:
    """One gemma-doctor command of a block, with the output and exit code the doc shows for it."""

    argv: list[str]
    output: list[str] = field(default_factory=list)
    code: int | None = None


@dataclass
class Block:
    """One fenced example that runs gemma-doctor."""

    doc: str
    line: int
    mark: str
    commands: list[Command]

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _parse(lang: str, body: str) -> list[Command]:
    commands: list[Command] = []
    current: Command | None = None
    prompt = lang in ("console", "text")
    body = re.sub(r"\\\n[ \t]*", " ", body)  # a shell line continued with a backslash is one command
    for raw in body.splitlines():
        line = raw.rstrip()
        if prompt and not line.startswith("$ "):
            if current is not None and line.strip():
                current.output.append(line)
            continue
        text = line[2:] if prompt else line
        argv = shlex.split(text, comments=True) if text.strip() else []
        if argv[:2] == ["echo", "$?"] and commands:
            current = Command(["echo"])  # its output is the previous command's exit code
            commands[-1].code = -1
            commands.append(current)
            continue
        current = Command(argv) if argv[:1] == ["gemma-doctor"] else None
        if current is not None:
            commands.append(current)
    # `$ echo $?` blocks: move the printed code onto the command before it
    out: list[Command] = []
    for c in commands:
        if c.argv == ["echo"]:
            out[-1].code = int(c.output[0]) if c.output else None
        else:
            out.append(c)
    return out


def doc_blocks() -> list[Block]:
    """Every fenced block of the docs with at least one gemma-doctor command."""
    blocks = []
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            if m.group("lang") not in SHELL_LANGS:
                continue
            commands = _parse(m.group("lang"), m.group("body"))
            if commands:
                line = text[:m.start("body")].count("\n")
                blocks.append(Block(str(path.relative_to(ROOT)), line, (m.group("mark") or "").strip(), commands))
    return blocks


BLOCKS = doc_blocks()


def test_the_docs_have_examples_and_every_skip_says_why():
    assert len(BLOCKS) >= 8
    for b in BLOCKS:
        assert b.mark in ("", "hub", "hub, no token") or re.fullmatch(r"skip: \S.*", b.mark), (b.id, b.mark)


@pytest.fixture(scope="module")
def hub_server(tmp_path_factory) -> Iterator[object]:
    from tests.hubserver import HubServer, repos_from_cache

    storage = tmp_path_factory.mktemp("docs-hub")
    _example(storage)
    repos = repos_from_cache(storage)
    repos["google/gemma-3-12b-it"].gated, repos["google/gemma-3-12b-it"].readers = "manual", frozenset({TOKEN})
    with HubServer(repos) as server:
        yield server


def _example(dest: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_example_cache", ROOT / "examples" / "build_example_cache.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    mod.build(dest)


def _workspace(tmp: Path, cached: bool) -> tuple[Path, Path]:
    cache = tmp / "hub"
    cache.mkdir()
    if cached:
        _example(cache)
        HubCache(cache).add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config(), "generation_config.json": generation_config()})
        # docs/after-training.md's Gemma 4 adapter names it as its base: its config is enough.
        HubCache(cache).add("google/gemma-4-E2B-it",
                            {"config.json": (ROOT / "examples" / "google--gemma-4-E2B-it" / "config.json").read_bytes()})
    work = tmp / "work"
    (work / "train").mkdir(parents=True)
    for name in ("train.yaml", "sft.yaml", "train/sft.yaml"):
        (work / name).write_text("bf16: true\nper_device_train_batch_size: 1\nmax_length: 512\n")
    (work / "train" / "dpo.json").write_text('{"bf16": true, "beta": 0.1, "max_grad_norm": 1.0}\n')
    (work / "requirements.txt").write_text("transformers==4.50.3\n")
    _after_training(work)
    # docs/distributed.md: an accelerate FSDP2 config without a class list, and with the one GD660 names.
    accel = ("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"
             "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_reshard_after_forward: true\n"
             "  fsdp_state_dict_type: SHARDED_STATE_DICT\nmixed_precision: bf16\nnum_machines: 2\nnum_processes: 16\n")
    (work / "accelerate.yaml").write_text(accel)
    (work / "accelerate-fixed.yaml").write_text(accel.replace(
        "TRANSFORMER_BASED_WRAP\n", "TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: Gemma3DecoderLayer\n"))
    return cache, work


def _after_training(work: Path) -> None:
    """docs/after-training.md's folders: a LoRA adapter of the cached gemma-3-1b-it with modules_to_save on the tied
    pair (as PEFT 0.17.1 writes it), and a merged model that saves a head unlike its embedding beside a tied config."""
    from tests.test_safetensors import st_file

    adapter = work / "my-adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "base_model_name_or_path": "google/gemma-3-1b-it", "r": 16, "lora_alpha": 32,
        "target_modules": ["q_proj", "v_proj"], "modules_to_save": ["embed_tokens", "lm_head"], "revision": None}))
    lora = {f"base_model.model.model.layers.{i}.self_attn.{p}.lora_{ab}.weight": ("F32", [16, 8] if ab == "A" else [8, 16])
            for i in range(2) for p in ("q_proj", "v_proj") for ab in "AB"}
    full = {"base_model.model.model.embed_tokens.weight": ("F32", [256, 8]),
            "base_model.model.lm_head.weight": ("F32", [256, 8])}
    (adapter / "adapter_model.safetensors").write_bytes(st_file({**lora, **full}))
    # A Gemma 4 adapter of the cached gemma-4-E2B-it whose keys reach the vision tower (target_modules="all-linear").
    g4 = work / "gemma4-adapter"
    g4.mkdir()
    (g4 / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "base_model_name_or_path": "google/gemma-4-E2B-it", "r": 8, "lora_alpha": 16,
        "target_modules": "all-linear", "modules_to_save": None}))
    modules = ["model.language_model.layers.0.self_attn.q_proj", "model.vision_tower.encoder.layers.0.self_attn.q_proj.linear",
               "model.vision_tower.encoder.layers.0.mlp.down_proj.linear"]
    (g4 / "adapter_model.safetensors").write_bytes(st_file({
        f"base_model.model.{m}.lora_{ab}.weight": ("F32", [8, 4] if ab == "A" else [4, 8]) for m in modules for ab in "AB"}))
    merged = work / "merged"
    merged.mkdir()
    # indented as save_pretrained writes it, so that fix's diff is the one line it changes
    (merged / "config.json").write_text(json.dumps({k: v for k, v in gemma3_1b_config().items() if k != "use_cache"},
                                                   indent=2) + "\n")
    weights = bytearray(st_file({"model.embed_tokens.weight": ("BF16", [256, 8]), "model.norm.weight": ("BF16", [8]),
                                 "lm_head.weight": ("BF16", [256, 8])}, {"format": "pt"}))
    weights[-256 * 8 * 2:] = b"\x80\x3f" * (256 * 8)  # the trained head: BF16 1.0 where the embedding holds zeros
    (merged / "model.safetensors").write_bytes(bytes(weights))


def _collapse(text: str) -> str:
    return " ".join(text.split())


def shown_but_missing(shown: list[str], actual: str) -> list[str]:
    """The doc's output lines that the real output does not contain (``...``/``…`` elide)."""
    real = _collapse(actual)
    missing = []
    for line in shown:
        pieces = [p.strip() for p in re.split(r"\.\.\.|…", _collapse(line))]
        if not all(p in real for p in pieces if p):
            missing.append(line)
    return missing


@pytest.mark.parametrize("block", [b for b in BLOCKS if not b.mark.startswith("skip")], ids=lambda b: b.id)
def test_doc_example_runs_as_shown(block, tmp_path, request):
    remote = block.mark.startswith("hub")
    cache, work = _workspace(tmp_path, cached=not remote)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "GEMMA_DOCTOR_", "PYTHON"))}
    env.update(PYTHONPATH=str(ROOT), HF_HUB_CACHE=str(cache), HF_HOME=str(tmp_path / "hf-home"), NO_COLOR="1",
               COLUMNS="100")
    endpoint = None
    if remote:
        server = request.getfixturevalue("hub_server")
        endpoint = server.endpoint
        env["HF_ENDPOINT"] = endpoint
        if block.mark == "hub":
            env["HF_TOKEN"] = TOKEN
    else:
        env["HF_HUB_OFFLINE"] = "1"
    for command in block.commands:
        r = subprocess.run([sys.executable, "-m", "gemma_doctor", *command.argv[1:]], cwd=work, env=env, text=True,
                           capture_output=True, timeout=120)
        shown = " ".join(command.argv)
        if command.code is not None:
            assert r.returncode == command.code, (block.id, shown, r.stdout[-2000:], r.stderr[-2000:])
        else:
            assert r.returncode in (0, 1), (block.id, shown, r.stdout[-2000:], r.stderr[-2000:])
        actual = (r.stdout + r.stderr).replace(str(cache), HOME_CACHE)
        if endpoint:
            actual = actual.replace(endpoint, "https://huggingface.co")
        missing = shown_but_missing(command.output, actual)
        assert not missing, f"{block.id}: `{shown}` no longer prints:\n" + "\n".join(missing) + "\n--- it prints:\n" + actual


def test_readme_offline_recipe_reproduces_both_hub_examples(tmp_path):
    """README's "Try it offline" recipe, run as a user would (its own command line, a shell, the printed variables):
    its server must reproduce both Hub examples, the check with a token that has access and the gated exit 4
    without one. It served the repos ungated and printed no token, so the gated example could not be reproduced."""
    import queue
    import signal
    import threading
    import time

    readme = (ROOT / "README.md").read_text()
    recipe = re.search(r"`(python examples/build_example_cache\.py (\S+) && python -m tests\.hubserver\s+(\S+))`",
                       readme, re.S)
    assert recipe is not None and recipe.group(2) == recipe.group(3), "README's offline recipe moved"
    folder = tmp_path / "ex"
    line = " ".join(recipe.group(1).split()).replace(recipe.group(2), shlex.quote(str(folder)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "GEMMA_DOCTOR_", "PYTHON"))}
    env.update(PYTHONPATH=str(ROOT), NO_COLOR="1", COLUMNS="100")
    server = subprocess.Popen(["bash", "-c", line], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        printed: dict[str, str] = {}
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(out) for out in server.stdout or ()], daemon=True).start()
        # the recipe's output until the server says what to export (it prints its variables together, once up)
        deadline = time.monotonic() + 180
        while len(printed) < 2 and time.monotonic() < deadline and server.poll() is None:
            try:
                key, _, value = lines.get(timeout=1).strip().partition("=")
            except queue.Empty:
                continue
            if key in ("HF_ENDPOINT", "HF_TOKEN"):
                printed[key] = value
                deadline = min(deadline, time.monotonic() + 10)
        assert set(printed) == {"HF_ENDPOINT", "HF_TOKEN"}, printed
        hub = [b for b in BLOCKS if b.doc == "README.md" and b.mark in ("hub", "hub, no token")]
        assert sorted(b.mark for b in hub) == ["hub", "hub, no token"]
        for block in hub:
            user = {**env, "HF_ENDPOINT": printed["HF_ENDPOINT"], "HF_HOME": str(tmp_path / f"home-{len(block.mark)}"),
                    "HF_HUB_CACHE": str(tmp_path / f"cache-{len(block.mark)}")}
            if block.mark == "hub":
                user["HF_TOKEN"] = printed["HF_TOKEN"]
            for command in block.commands:
                r = subprocess.run([sys.executable, "-m", "gemma_doctor", *command.argv[1:]], cwd=tmp_path, env=user,
                                   text=True, capture_output=True, timeout=120)
                assert r.returncode == (command.code if command.code is not None else 1), (block.mark, r.stderr)
                actual = (r.stdout + r.stderr).replace(printed["HF_ENDPOINT"], "https://huggingface.co")
                assert not shown_but_missing(command.output, actual), (block.mark, actual)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
