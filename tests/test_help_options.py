"""Every option `--help` shows works (issue 9, point 8): a table with one run per option, short name and choice.

The first test walks each command's --help as a user reads it and fails when it shows an option (or a choice of
one) that the table below does not exercise, so a new option cannot ship untried; the second runs each row on a
small cache and requires what the row says: no usage error, no internal error.
"""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from gemma_doctor.cli import app
from tests.builders import gemma3_1b_config, generation_config

REPO = "google/gemma-3-1b-it"
TINY = "acme/tiny-gemma-3"
ANY = (0, 1)  # checked, with or without findings
OFFLINE = (5,)  # --remote while HF_HUB_OFFLINE=1 (tests never reach a network): "the Hub could not be asked"

# (command, what --help shows: an option, or OPTION=CHOICE, or a positional CHOICE) -> the extra arguments of one run
# and the exit codes it may end with. Every run also gets the command's base arguments (BASE below).
CASES: list[tuple[str, str, list[str], tuple[int, ...]]] = [
    ("", "--version", ["--version"], (0,)),
    ("", "--help", ["--help"], (0,)),
    ("", "-h", ["-h"], (0,)),
    ("completion", "bash", ["bash"], (0,)),
    ("completion", "zsh", ["zsh"], (0,)),
    ("completion", "fish", ["fish"], (0,)),
    ("completion", "--help", ["--help"], (0,)),
    ("completion", "-h", ["-h"], (0,)),
    ("check", "--cache-dir", [], ANY),
    ("check", "--revision", ["--revision", "main"], ANY),
    ("check", "--all-revisions", ["--all-revisions"], ANY),
    ("check", "--format=text", ["--format", "text"], ANY),
    ("check", "--format=json", ["--format", "json"], ANY),
    ("check", "--format=github", ["--format", "github"], ANY),
    ("check", "-f", ["-f", "json"], ANY),
    ("check", "--fail-on=error", ["--fail-on", "error", "--with", "transformers==4.50.3"], (1,)),
    ("check", "--fail-on=warning", ["--fail-on", "warning", "--with", "transformers==4.50.3"], (1,)),
    ("check", "--fail-on=never", ["--fail-on", "never", "--with", "transformers==4.50.3"], (0,)),
    ("check", "--weights", ["--weights"], ANY),
    ("check", "--jobs", ["--weights", "--jobs", "2"], ANY),
    ("check", "-j", ["--weights", "-j", "2"], ANY),
    ("check", "--gpu", ["--gpu", "T4"], ANY),
    ("check", "--task", ["--task", "dpo"], ANY),
    ("check", "--training-config", ["--training-config", "{train}"], ANY),
    ("check", "--launch", ["--launch", "torchrun --nnodes 2 --nproc-per-node 4 train.py --bf16"], ANY),
    ("check", "--with", ["--with", "transformers==4.50.3"], (1,)),
    ("check", "--requirements", ["--requirements", "{requirements}"], (1,)),
    ("check", "--remote", ["--remote"], OFFLINE),
    ("check", "--hub-deadline", ["--remote", "--hub-deadline", "5"], OFFLINE),
    ("check", "--method=full", ["--gpu", "A100", "--method", "full"], ANY),
    ("check", "--method=lora", ["--gpu", "A100", "--method", "lora"], ANY),
    ("check", "--method=qlora", ["--gpu", "A100", "--method", "qlora"], ANY),
    ("check", "--batch-size", ["--gpu", "A100", "--batch-size", "2"], ANY),
    ("check", "--seq-len", ["--gpu", "A100", "--seq-len", "512"], ANY),
    ("check", "--gradient-checkpointing", ["--gpu", "A100", "--gradient-checkpointing"], ANY),
    ("check", "--no-gradient-checkpointing", ["--gpu", "A100", "--no-gradient-checkpointing"], ANY),
    # Real rehearsals, of a tiny Gemma 3 of a 256-token vocabulary ({tiny} replaces the 1B of 262,144, whose twin keeps
    # that vocabulary and took minutes here; tests/test_rehearse.py covers what rehearsals find); its one tensor is no
    # checkpoint to measure, so --real-weights ends in a finding (GD964), not an error line.
    ("check", "--rehearse", ["{tiny}", "--rehearse", "--fail-on", "never"], (0,)),
    ("check", "--real-weights", ["{tiny}", "--rehearse", "--real-weights", "--fail-on", "never"], (0,)),
    ("check", "--gpu-memory", ["--gpu", "A100", "--gpu-memory", "80"], ANY),
    ("check", "--num-gpus", ["--gpu", "A100", "--num-gpus", "2"], ANY),
    ("check", "--help", ["--help"], (0,)),
    ("check", "-h", ["-h"], (0,)),
    ("fix", "--inplace", ["--inplace", "--with", "transformers==4.50.3"], (0,)),
    ("fix", "--cache-dir", [], (0,)),
    ("fix", "--revision", ["--revision", "main"], (0,)),
    ("fix", "--all-revisions", ["--all-revisions"], (0,)),
    ("fix", "--format=text", ["--format", "text"], (0,)),
    ("fix", "--format=json", ["--format", "json"], (0,)),
    ("fix", "-f", ["-f", "json"], (0,)),
    ("fix", "--lock-timeout", ["--inplace", "--lock-timeout", "5", "--with", "transformers==4.50.3"], (0,)),
    ("fix", "--with", ["--with", "transformers==4.50.3"], (0,)),
    ("fix", "--requirements", ["--requirements", "{requirements}"], (0,)),
    ("fix", "--help", ["--help"], (0,)),
    ("fix", "-h", ["-h"], (0,)),
    ("restore", "--dry-run", ["--dry-run"], (0,)),
    ("restore", "--force", ["--force"], (0,)),
    ("restore", "--cache-dir", [], (0,)),
    ("restore", "--revision", ["--revision", "main"], (0,)),
    ("restore", "--all-revisions", ["--all-revisions"], (0,)),
    ("restore", "--format=text", ["--format", "text"], (0,)),
    ("restore", "--format=json", ["--format", "json"], (0,)),
    ("restore", "-f", ["-f", "json"], (0,)),
    ("restore", "--lock-timeout", ["--lock-timeout", "5"], (0,)),
    ("restore", "--help", ["--help"], (0,)),
    ("restore", "-h", ["-h"], (0,)),
    ("recommend", "--family", ["--family", "gemma2"], (0,)),
    ("recommend", "--gpu", ["--gpu", "T4"], (0,)),
    ("recommend", "--task", ["--task", "dpo"], (0,)),
    ("recommend", "--quantization", ["--quantization", "4bit"], (0,)),
    ("recommend", "--qlora", ["--qlora"], (0,)),
    ("recommend", "--cache-dir", [], (0,)),
    ("recommend", "--revision", ["--revision", "main"], (0,)),
    ("recommend", "--format=text", ["--format", "text"], (0,)),
    ("recommend", "--format=python", ["--format", "python"], (0,)),
    ("recommend", "--format=yaml", ["--format", "yaml"], (0,)),
    ("recommend", "--format=json", ["--format", "json"], (0,)),
    ("recommend", "-f", ["-f", "json"], (0,)),
    ("recommend", "--with", ["--with", "transformers==4.50.3"], (0,)),
    ("recommend", "--requirements", ["--requirements", "{requirements}"], (0,)),
    ("recommend", "--remote", ["--remote"], OFFLINE),
    ("recommend", "--hub-deadline", ["--remote", "--hub-deadline", "5"], OFFLINE),
    ("recommend", "--method=full", ["--gpu", "A100", "--method", "full"], (0,)),
    ("recommend", "--method=lora", ["--gpu", "A100", "--method", "lora"], (0,)),
    ("recommend", "--method=qlora", ["--gpu", "A100", "--method", "qlora"], (0,)),
    ("recommend", "--batch-size", ["--gpu", "A100", "--batch-size", "2"], (0,)),
    ("recommend", "--seq-len", ["--gpu", "A100", "--seq-len", "512"], (0,)),
    ("recommend", "--gradient-checkpointing", ["--gpu", "A100", "--gradient-checkpointing"], (0,)),
    ("recommend", "--no-gradient-checkpointing", ["--gpu", "A100", "--no-gradient-checkpointing"], (0,)),
    ("recommend", "--gpu-memory", ["--gpu", "A100", "--gpu-memory", "80"], (0,)),
    ("recommend", "--num-gpus", ["--gpu", "A100", "--num-gpus", "2"], (0,)),
    ("recommend", "--size", ["--family", "gemma3", "--size", "12b"], (0,)),
    ("recommend", "--training-config", ["--training-config", "{train}"], (0,)),
    ("recommend", "--trainer", ["--trainer", "trl"], (0,)),
    # A --family plan: the option's path without a child (no config.json to build a twin from, said in one line);
    # tests/test_rehearse.py rehearses real prescriptions.
    ("recommend", "--rehearse", ["--family", "gemma3", "--rehearse"], (0,)),
    ("recommend", "--rehearse-timeout", ["--family", "gemma3", "--rehearse", "--rehearse-timeout", "30"], (0,)),
    ("recommend", "--help", ["--help"], (0,)),
    ("recommend", "-h", ["-h"], (0,)),
    ("list", "--cache-dir", [], (0,)),
    ("list", "--revision", ["--revision", "main"], (0,)),
    ("list", "--all-revisions", ["--all-revisions"], (0,)),
    ("list", "--filter", ["--filter", "family=gemma3"], (0,)),
    ("list", "--sort", ["--sort", "size:desc"], (0,)),
    ("list", "--limit", ["--limit", "1"], (0,)),
    ("list", "--format=text", ["--format", "text"], (0,)),
    ("list", "--format=json", ["--format", "json"], (0,)),
    ("list", "--format=quiet", ["--format", "quiet"], (0,)),
    ("list", "-f", ["-f", "json"], (0,)),
    ("list", "--quiet", ["--quiet"], (0,)),
    ("list", "-q", ["-q"], (0,)),
    ("list", "--with", ["--with", "transformers==4.50.3"], (0,)),
    ("list", "--requirements", ["--requirements", "{requirements}"], (0,)),
    ("list", "--help", ["--help"], (0,)),
    ("list", "-h", ["-h"], (0,)),
]

# What every run of a command starts with ({cache} is the test's hub cache). recommend --family plans without a
# target, so a row giving --family drops the target (see _argv).
BASE = {"": [], "completion": [], "check": [REPO, "--cache-dir", "{cache}"], "fix": [REPO, "--cache-dir", "{cache}"],
        "restore": [REPO, "--cache-dir", "{cache}"], "recommend": [REPO, "--cache-dir", "{cache}"],
        "list": ["--cache-dir", "{cache}"]}


def shown_in_help(command: str) -> set[str]:
    """The options (and choices) --help shows for ``command`` ("" for the top level), as a user reads them."""
    text = CliRunner().invoke(app, [command, "--help"] if command else ["--help"], terminal_width=200).output
    usage, _, rest = text.partition("Options:")
    shown: set[str] = set()
    for line in rest.splitlines():
        m = re.match(r"^\s{2}((?:-{1,2}[\w-]+(?:\s*/\s*|,\s*)?)+)\s*(\S*)", line)
        if not m:
            continue
        names = re.findall(r"-{1,2}[\w-]+", m.group(1))
        choices = re.match(r"\[([\w|-]+)\]$", m.group(2) or "")
        if choices and "|" in choices.group(1):
            long = next(n for n in names if n.startswith("--"))
            shown |= {f"{long}={c}" for c in choices.group(1).split("|")}
            shown |= {n for n in names if not n.startswith("--")}
        else:
            shown |= set(names)
    for choices in re.findall(r"\{([\w|-]+)\}", usage):  # a positional choice: completion {bash|zsh|fish}
        shown |= set(choices.split("|"))
    return shown


@pytest.mark.parametrize("command", sorted(BASE))
def test_every_option_the_help_shows_has_a_row_in_the_table(command):
    table = {token for cmd, token, _args, _codes in CASES if cmd == command}
    shown = shown_in_help(command)
    assert shown, f"could not read `gemma-doctor {command} --help`"
    assert shown == table, f"untested options shown: {sorted(shown - table)}; rows for options not shown: {sorted(table - shown)}"


@pytest.fixture
def cache(hub, tmp_path):
    """A tiny cached gemma-3-1b-it (real safetensors), a training config and a requirements file."""
    import json

    header = json.dumps({"model.embed_tokens.weight": {"dtype": "BF16", "shape": [4, 2], "data_offsets": [0, 16]}}).encode()
    header += b" " * (-len(header) % 8)
    hub.add(REPO, {"config.json": gemma3_1b_config(), "generation_config.json": generation_config(),
                   "model.safetensors": len(header).to_bytes(8, "little") + header + b"\x80\x3f" * 8})
    tiny = {**gemma3_1b_config(), "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 256, "sliding_window": 8,
            "max_position_embeddings": 128}
    hub.add(TINY, {"config.json": tiny, "generation_config.json": generation_config(),
                   "model.safetensors": len(header).to_bytes(8, "little") + header + b"\x80\x3f" * 8})
    (tmp_path / "train.yaml").write_text("bf16: true\nper_device_train_batch_size: 1\n")
    (tmp_path / "requirements.txt").write_text("transformers==4.50.3\n")
    return {"cache": str(hub.root), "train": str(tmp_path / "train.yaml"), "requirements": str(tmp_path / "requirements.txt"),
            "tiny": TINY}


def _argv(command: str, args: list[str], paths: dict[str, str]) -> list[str]:
    base = [a for a in BASE[command] if not (("--family" in args or "{tiny}" in args) and a == REPO)]
    return [a.format(**paths) for a in ([command] if command else []) + base + args]


@pytest.mark.parametrize("command, token, args, codes", CASES, ids=[f"{c or 'gemma-doctor'} {t}" for c, t, _a, _k in CASES])
def test_each_option_runs_as_its_help_says(cli, cache, command, token, args, codes):
    r = cli(*_argv(command, args, cache))
    assert r.code in codes, r
    if r.code != 5:
        assert "error:" not in r.err, r
    assert r.out or r.err


def test_recommend_help_names_every_published_size_and_its_family():
    """`recommend --help` listed the sizes of gemma3 and gemma2 only and no gemma4 among the families, although
    `--family gemma4 --size e4b` (and gemma's 2b / 7b) plan: the help names what plan/memory.py PUBLISHED knows."""
    from gemma_doctor.plan import memory

    out = " ".join(CliRunner().invoke(app, ["recommend", "--help"], terminal_width=1000).output.split())
    family = out.split("--family TEXT ", 1)[1].split(" --gpu ", 1)[0]
    size = out.split("--size TEXT ", 1)[1].split(" --training-config ", 1)[0]
    for name, sizes in memory.PUBLISHED.items():
        assert re.search(rf"\b{name}\b", family), (name, family)
        assert f"{name}: {', '.join(sizes)}" in size, (name, tuple(sizes), size)
