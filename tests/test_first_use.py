"""Issue 9: gemma-doctor as a new user finds it. Each test names the point of the issue it keeps fixed."""

from __future__ import annotations

import json

import pytest

from tests.builders import gemma3_12b_config, generation_config

SHARD_1, SHARD_2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


def _safetensors(names: list[str]) -> bytes:
    """A valid safetensors file holding one BF16 scalar-ish tensor per name."""
    header = {n: {"dtype": "BF16", "shape": [1], "data_offsets": [2 * i, 2 * i + 2]} for i, n in enumerate(names)}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + b"\0" * (2 * len(names))


def _sharded(hub, repo: str, second: bytes | None):  # noqa: ANN001, ANN202
    files = {"config.json": gemma3_12b_config(), "generation_config.json": generation_config(),
             "model.safetensors.index.json": {"metadata": {}, "weight_map": {"a": SHARD_1, "b": SHARD_2}},
             SHARD_1: _safetensors(["a"])}
    if second is not None:
        files[SHARD_2] = second
    return hub.add(repo, files)


# --- point 2: list tells a broken download from a missing fix ------------------------------------------------

@pytest.mark.parametrize("plan", [[], ["--with", "transformers==4.50.3"]], ids=["installed", "planned-4.50"])
@pytest.mark.parametrize("second, code", [(None, "GD203"), (_safetensors(["b"])[:-1], "GD204")],
                         ids=["missing-shard", "truncated-shard"])
def test_list_calls_a_model_with_a_missing_or_truncated_shard_broken_and_says_download_it_again(hub, cli, plan, second, code):
    _sharded(hub, "google/gemma-3-4b-it", second)
    check = cli("check", "google/gemma-3-4b-it", "--cache-dir", hub.root, "--format", "json", *plan)
    assert code in {f["code"] for f in check.json()["models"][0]["findings"]}
    row = cli("list", "--cache-dir", hub.root, "--format", "json", *plan).json()["models"][0]
    assert row["status"] == "broken"
    assert row["next_command"] == f"hf download google/gemma-3-4b-it {SHARD_2} --cache-dir {hub.root} --force-download"
    text = cli("list", "--cache-dir", hub.root, *plan)
    assert text.out.split("\n")[1].split()[-1] == "broken"
    assert "gemma-doctor fix" not in text.err and "--inplace" not in text.err and "need a fix" not in text.err
    assert f"hf download google/gemma-3-4b-it {SHARD_2}" in text.err and "--force-download" in text.err
    assert cli("list", "--cache-dir", hub.root, "--filter", "status=broken", "--quiet", *plan).out == "google/gemma-3-4b-it\n"


def test_list_keeps_calling_a_complete_model_ok(hub, cli):
    _sharded(hub, "google/gemma-3-4b-it", _safetensors(["b"]))
    row = cli("list", "--cache-dir", hub.root, "--format", "json").json()["models"][0]
    assert (row["status"], row["next_command"]) == ("ok", None)


# --- point 4: a CI gate that checked nothing does not pass ---------------------------------------------------

@pytest.mark.parametrize("fmt", ["text", "json", "github"])
@pytest.mark.parametrize("content", ["empty", "llama-only"])
def test_check_on_a_cache_without_gemma_models_is_a_usage_error_not_a_pass(hub, cli, fmt, content):
    from tests.builders import llama_config

    if content == "llama-only":
        hub.add("meta/llama", {"config.json": llama_config()})
    r = cli("check", "--cache-dir", hub.root, "--format", fmt)
    assert r.code == 2, r
    assert r.out == "" and "OK" not in r.err
    assert r.err.startswith(f"gemma-doctor: error: nothing to check: no Gemma-family model in {hub.root}")
    assert r.err.count("\n") == 1 and "hf download google/gemma-3-1b-it" in r.err
    assert ("1 other repo(s) skipped" in r.err) is (content == "llama-only")


def test_check_of_a_named_model_that_is_not_a_gemma_says_what_its_finding_says(hub, cli):
    """Named alone, a model that is not a Gemma is a usage error that quotes its GD003 finding whole (what a finding
    is comes from its code's entry, its text as the rule wrote it: tests/test_codes_data.py)."""
    from tests.builders import llama_config

    hub.add("meta/llama", {"config.json": llama_config()})
    r = cli("check", "meta/llama", "--cache-dir", hub.root)
    assert r.code == 2 and r.out == "" and r.err.count("\n") == 1
    assert r.err == ("gemma-doctor: error: nothing to check: gemma-doctor checks Gemma-family models only; meta/llama: "
                     "not a Gemma-family model (model_type 'llama'); left alone\n")


def test_check_on_a_cache_with_a_gemma_model_still_passes(hub, cli):
    hub.add("google/gemma-3-4b-it", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    r = cli("check", "--cache-dir", hub.root)
    assert r.code == 0 and r.out.rstrip().splitlines()[-1].startswith("OK 1 model(s)"), r


# --- point 6: the training-config lint reads a typical TRL DPO YAML ------------------------------------------

TRL_DPO_YAML = """\
# trl dpo --config dpo.yaml (TRL's DPOConfig; no `rl:` key, no --task)
model_name_or_path: google/gemma-3-4b-it
output_dir: gemma-3-4b-dpo
beta: 0.1
loss_type: sigmoid
max_prompt_length: 512
max_length: 1024
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
max_grad_norm: 0
bf16: true
"""


def _lint(hub, cli, tmp_path, text: str, *args: str, name: str = "dpo.yaml") -> dict[str, dict]:  # noqa: ANN001
    hub.add("google/gemma-3-4b-it", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    path = tmp_path / name
    path.write_text(text)
    r = cli("check", "google/gemma-3-4b-it", "--cache-dir", hub.root, "--training-config", path, "--format", "json", *args)
    assert r.code in (0, 1), r
    return {f["code"]: f for f in r.json()["models"][0]["findings"]}


def test_a_trl_dpo_yaml_with_clipping_off_gives_gd607_without_task(hub, cli, tmp_path):
    found = _lint(hub, cli, tmp_path, TRL_DPO_YAML, "--gpu", "A100")
    gd607 = found["GD607"]
    assert gd607["severity"] == "warning" and gd607["key"] == "max_grad_norm" and gd607["details"]["line"] == 10
    assert gd607["message"].startswith("DPO on gemma3: max_grad_norm is 0, which turns gradient clipping off")


@pytest.mark.parametrize("loss_type, dpo", [("sigmoid", True), ("ipo", True), ("kto", False)])
def test_beta_with_a_dpo_loss_type_is_dpo_and_other_trainers_are_not(hub, cli, tmp_path, loss_type, dpo):
    text = f"beta: 0.1\nloss_type: {loss_type}\nmax_grad_norm: 0\nbf16: true\n"
    assert ("GD607" in _lint(hub, cli, tmp_path, text, "--gpu", "A100")) is dpo


def test_a_config_without_preference_keys_is_not_dpo(hub, cli, tmp_path):
    assert "GD607" not in _lint(hub, cli, tmp_path, "max_grad_norm: 0\nbf16: true\n", "--gpu", "A100")


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
def test_model_init_kwargs_loading_gemma3_in_float16_is_an_error(hub, cli, tmp_path, key):
    text = f"bf16: true\nmodel_init_kwargs:\n  {key}: float16\n"
    gd610 = _lint(hub, cli, tmp_path, text, "--gpu", "A100", name="sft.yaml")["GD610"]
    assert gd610["severity"] == "error" and gd610["key"] == f"model_init_kwargs.{key}"
    assert gd610["details"]["line"] == 3 and "65504" in gd610["message"]


def test_model_init_kwargs_in_bfloat16_is_fine(hub, cli, tmp_path):
    found = _lint(hub, cli, tmp_path, "bf16: true\nmodel_init_kwargs:\n  torch_dtype: bfloat16\n", "--gpu", "A100", name="sft.yaml")
    assert "GD610" not in found and "GD602" not in found


@pytest.mark.parametrize("text, gd303", [
    ("bf16: false\nfp16: false\n", False),  # the user chose fp32 explicitly: nothing for bf16 auto to pick
    ("bf16: true\n", False),  # explicit (GD603 says bf16 is not native)
    ("bf16: auto\n", True),  # the trap is live: auto is what resolves through is_bf16_supported()
    ("learning_rate: 1.0e-5\n", True),  # precision not set: the launcher's default decides
])
def test_gd303_fires_only_where_the_config_leaves_precision_to_auto(hub, cli, tmp_path, text, gd303):
    assert ("GD303" in _lint(hub, cli, tmp_path, text, "--gpu", "T4", name="sft.yaml")) is gd303


# --- point 7: advice that does not contradict itself ---------------------------------------------------------

@pytest.mark.parametrize("zero, expected", [([0], None), ([0, 5, 6], "2 all-zero row(s) of 8: 5-6"), ([5], "1 all-zero row(s) of 8: 5")])
def test_gd503_does_not_count_the_pad_row(hub, cli, tmp_path, zero, expected):
    import numpy as np
    from safetensors.numpy import save_file

    from tests.builders import gemma3_1b_config

    emb = np.ones((8, 4), dtype=np.float32)
    emb[zero] = 0.0
    save_file({"model.embed_tokens.weight": emb}, str(tmp_path / "model.safetensors"))
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config(), "model.safetensors": (tmp_path / "model.safetensors").read_bytes()})
    r = cli("check", "google/gemma-3-1b-it", "--cache-dir", hub.root, "--weights", "--format", "json")
    gd503 = [f for f in r.json()["models"][0]["findings"] if f["code"] == "GD503"]
    assert [f["message"].split(": ", 1)[0].split(" has ")[1] + ": " + f["message"].split(": ", 1)[1].split(" (")[0]
            for f in gd503] == ([expected] if expected else [])


@pytest.mark.parametrize("text, words", [
    ("bf16: true\ngradient_checkpointing: true\nuse_cache: true\n",
     "use_cache is true in the training config: it conflicts with gradient_checkpointing: true, and transformers turns "
     "it off with a warning; with bf16: true the evaluation loop builds a HybridCache, on which transformers "
     "4.50.0-4.50.3 crash"),
])
def test_gd606_reads_as_a_sentence(hub, cli, tmp_path, text, words):
    assert _lint(hub, cli, tmp_path, text, "--gpu", "A100", name="sft.yaml")["GD606"]["message"].startswith(words)


def test_no_message_cites_material_users_do_not_have():
    import ast
    import pathlib
    import re

    package = pathlib.Path(__file__).resolve().parent.parent / "gemma_doctor"
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                      and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        # What a user can read: string literals, not docstrings or comments (which may cite the project's notes).
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                assert not re.search(r"seed 00\d|facts\.md", node.value), (path, node.value)


def test_no_user_doc_cites_material_users_do_not_have():
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parent.parent
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        found = re.findall(r".{0,40}(?:seed 00\d|facts\.md).{0,20}", path.read_text())
        assert not found, (path.name, found)


GEMMA1 = {"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "hidden_size": 2048, "num_hidden_layers": 18,
          "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 16384,
          "vocab_size": 256000, "torch_dtype": "bfloat16", "use_cache": True, "pad_token_id": 0}


@pytest.mark.parametrize("repo", ["google/gemma-2b", "google/gemma-3-4b-it", "google/gemma-3n-E2B-it"])
@pytest.mark.parametrize("plan", [[], ["--with", "transformers==4.50.3"]], ids=["installed", "planned-4.50"])
def test_recommend_says_fix_writes_on_disk_exactly_when_fix_would(hub, cli, repo, plan):
    from tests.builders import gemma3n_config

    config = {"google/gemma-2b": GEMMA1, "google/gemma-3-4b-it": gemma3_12b_config(),
              "google/gemma-3n-E2B-it": gemma3n_config()}[repo]
    hub.add(repo, {"config.json": config, "generation_config.json": generation_config()})
    rec = cli("recommend", repo, "--cache-dir", hub.root, "--gpu", "A100", "--format", "json", *plan)
    m = rec.json()["models"][0]
    # Gemma 3n without timm/Pillow installed has no prescription (GD110): the nearest run carries the same reasons
    [reason] = [r for r in (m["recommendation"] or m["nearest"])["reasons"] if r.startswith("use_cache=False")]
    fix = cli("fix", repo, "--cache-dir", hub.root, "--format", "json", *plan)
    writes = any(m["changes"] for m in fix.json()["models"])
    assert ("`gemma-doctor fix` sets it on disk" in reason) is writes, (reason, fix.out)
    assert ("nothing" in reason) is not writes
    if repo == "google/gemma-2b":
        assert "Gemma 1 builds no HybridCache" in reason


# --- point 8: help, docs and the tool agree -----------------------------------------------------------------

@pytest.mark.parametrize("command", ["fix", "restore"])
def test_fix_and_restore_offer_only_the_formats_they_accept(cli, command):
    helptext = cli(command, "--help").out
    assert "[text|json]" in helptext and "github" not in helptext
    r = cli(command, "--format", "github")
    assert r.code == 2 and "'github' is not one of 'text', 'json'" in r.err and r.err.count("\n") == 1


def test_check_offers_github():
    from click.testing import CliRunner

    from gemma_doctor.cli import app

    assert "[text|json|github]" in CliRunner().invoke(app, ["check", "--help"]).output


def test_the_public_enums_import_from_the_package():
    from gemma_doctor import ExitCode, FailOn, Severity

    assert FailOn("warning").fails(Severity.WARNING) and ExitCode.USAGE == 2


def test_docs_do_not_send_users_to_pypi_or_to_options_that_do_not_exist():
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parent.parent
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        text = path.read_text()
        assert not re.search(r"pip install ['\"]?gemma-doctor\b", text), path.name
        assert "--install-completion" not in text, path.name


def test_readme_options_table_lists_every_format_check_accepts():
    import pathlib
    import re

    from gemma_doctor.render import OutputFormat

    readme = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
    row = re.search(r"^\| `--format ([^`]+)` \|", readme, flags=re.M)
    assert row and row.group(1).split("\\|") == [f.value for f in OutputFormat]


def test_paths_are_printed_without_dot_dot(hub, cli, tmp_path):
    snap = hub.add("google/gemma-3-4b-it", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    (tmp_path / "examples").mkdir()
    roundabout = tmp_path / "examples" / ".." / hub.root.name
    for args in (["check", "google/gemma-3-4b-it", "--cache-dir", roundabout],
                 ["check", str(roundabout / snap.relative_to(hub.root))],
                 ["list", "--cache-dir", roundabout, "--format", "json"],
                 ["fix", "google/gemma-3-4b-it", "--cache-dir", roundabout, "--with", "transformers==4.50.3"]):
        r = cli(*args)
        assert r.code in (0, 1), r
        assert "/../" not in r.out and str(hub.root) in r.out, (args, r.out)


def test_list_and_check_write_sizes_in_the_same_units(hub, cli):
    import re

    hub.add("google/gemma-3-4b-it", {"config.json": gemma3_12b_config(), "model.safetensors": _safetensors(["a"]),
                                     "extra.bin": b"\0" * 217_000})
    size = cli("list", "--cache-dir", hub.root, "--format", "json").json()["models"][0]["size"]
    assert 217_000 < size < 227_000
    table = cli("list", "--cache-dir", hub.root).out.splitlines()[1]
    assert re.search(rf"\b{size / 1000:.1f} kB\b", table), table
    check = cli("check", "google/gemma-3-4b-it", "--cache-dir", hub.root).out
    assert re.search(r"\(\d+ params, \d+ B\)", check), check  # the same writer: "2 B", not "2B"
    assert not re.search(r"\d(K|M|G)\b", table + check)


def test_a_lock_timeout_prints_no_diff(hub, cli):
    from gemma_doctor import undo
    from gemma_doctor.locate import resolve

    hub.add("google/gemma-3-4b-it", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    [snapshot] = resolve(["google/gemma-3-4b-it"], hub.root)
    with undo.locked(snapshot):
        r = cli("fix", "google/gemma-3-4b-it", "--inplace", "--cache-dir", hub.root, "--lock-timeout", "0.1",
                "--with", "transformers==4.50.3")
        js = cli("fix", "google/gemma-3-4b-it", "--inplace", "--cache-dir", hub.root, "--lock-timeout", "0.1",
                 "--with", "transformers==4.50.3", "--format", "json")
    assert r.code == 3 and "another gemma-doctor has held" in r.out, r
    assert "+++" not in r.out and "@@" not in r.out and '"use_cache": false' not in r.out
    assert js.json()["models"][0]["changes"] == []



def test_check_names_the_file_to_download_again(hub, cli):
    _sharded(hub, "google/gemma-3-4b-it", None)
    r = cli("check", "google/gemma-3-4b-it", "--cache-dir", hub.root, "--format", "json")
    gd203 = next(f for f in r.json()["models"][0]["findings"] if f["code"] == "GD203")
    assert gd203["fix"].endswith(f"hf download google/gemma-3-4b-it {SHARD_2} --cache-dir {hub.root} --force-download")


def test_ctrl_c_wrapped_by_python_in_a_runtime_error_is_an_interruption(monkeypatch, capsys):
    """Python 3.11 re-raises a KeyboardInterrupt that lands in a descriptor's __set_name__ (a dataclass being
    created during an import) as RuntimeError from it; that is still a Ctrl-C, exit 130, not an internal error."""
    import gemma_doctor.cli as cli_mod

    def interrupted(_argv):  # noqa: ANN001, ANN202
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            raise RuntimeError("Error calling __set_name__ on '_Field' instance 'skipped' in 'WeightsScan'") from e

    monkeypatch.setattr(cli_mod, "_invoke", interrupted)
    with pytest.raises(SystemExit) as exit_:
        cli_mod.main(["check"])
    assert exit_.value.code == 130
    assert "interrupted" in capsys.readouterr().err
