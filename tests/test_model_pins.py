"""Without transformers, the search starts from the pins the model's facts require (issue 32 item 5): a multimodal
Gemma 3's first candidate is judged with transformers>=5.6.0 (GD105) already pinned, once, where the search judged it
twice (rejected by GD105, then again with the pin). The prescription and its pins are the ones it was before."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gemma_doctor.plan import search
from tests.venvs import ROOT, ensure_light_venv, subprocess_env

G3, G4 = "google/gemma-3-12b-it", "google/gemma-4-E2B-it"


@pytest.fixture
def judged(monkeypatch) -> list[str | None]:
    """The transformers of the stack each search._judge call judged under (its source where it is a pin), in order:
    the real _judge runs, only its calls are recorded."""
    calls: list[str | None] = []
    real = search._judge

    def recorded(facts, env, *args, **kwargs):
        tf = env.libraries.get("transformers")
        calls.append(None if tf.absent else f"{tf.specifier} ({tf.source})")
        return real(facts, env, *args, **kwargs)

    monkeypatch.setattr(search, "_judge", recorded)
    return calls


def _requirements(tmp_path: Path) -> Path:
    reqs = tmp_path / "requirements.txt"  # a stack that names no transformers (as the grid's "none" points)
    reqs.write_text("peft==0.21.2\ntrl==1.16.0\naccelerate==1.15.0\n")
    return reqs


@pytest.mark.parametrize("trainer", ["axolotl", "trl"])
def test_a_multimodal_gemma3_is_judged_once_already_pinned_without_transformers(cli, examples, tmp_path, judged,
                                                                              trainer):
    """main judged the first candidate twice: under the stack with no transformers (GD105 rejects it: its window may
    hold the unknown version) and again with the pin; now once, with the pin from the start. Same pin, same run."""
    r = cli("recommend", G3, "--cache-dir", examples, "--requirements", _requirements(tmp_path), "--gpu", "A100",
            "--trainer", trainer, "--format", "json")
    m = r.json()["models"][0]
    assert r.code == 0 and m["prescription"]["pins"] == [{"requirement": "transformers>=5.6.0", "resolves": "GD105"}]
    assert judged == [">=5.6.0 (prescription)"]


def test_a_pin_that_follows_a_finding_of_the_run_stays_the_search_s(cli, examples, tmp_path, judged):
    """Gemma 4 E2B under axolotl: its model alone states GD109 (rope_parameters, transformers < 5.0), but the search's
    pin is GD107's (>=5.5.2: KV sharing without a cache, a finding of the run, reported ahead of GD109), which rules
    GD109 out too. Pinning GD109 first from the model would have added a pin (>=5.0.0) the prescription never needed:
    the model's pins are only those the rule reports ahead of every finding of the run."""
    r = cli("recommend", G4, "--cache-dir", examples, "--requirements", _requirements(tmp_path), "--gpu", "A100",
            "--format", "json")
    m = r.json()["models"][0]
    assert r.code == 0 and m["prescription"]["pins"] == [{"requirement": "transformers>=5.5.2", "resolves": "GD107"}]
    assert judged[0] is None  # no pin before the first candidate


def test_without_transformers_installed_check_judges_each_gemma3_once(tmp_path):
    """The README's install (`pip install -e .`, no transformers): `check` of a cache of distinct multimodal Gemma 3
    repos judged two candidates per model (benchmarks/no_transformers.py: search._judge 100 times for 50 models);
    now one. Run in the light venv, where transformers is not installed."""
    python = ensure_light_venv()
    script = tmp_path / "count.py"
    script.write_text(f"""
import contextlib, io, json, sys
sys.path.insert(0, {str(ROOT / "benchmarks")!r})
from pathlib import Path
import startup
cache = Path({str(tmp_path / "cache")!r})
startup.build_cache(cache, 6, "distinct")  # 3 Gemma 3 repos (distinct facts) and 3 Llama ones
from gemma_doctor.plan import search
calls = []
real = search._judge
def recorded(facts, env, *a, **k):
    calls.append(env.libraries.get("transformers").specifier)
    return real(facts, env, *a, **k)
search._judge = recorded
from gemma_doctor.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main(["check", "--cache-dir", str(cache), "--format", "json", "--fail-on", "never"])
    except SystemExit:
        pass
import importlib.util
print(json.dumps({{"calls": calls, "transformers": importlib.util.find_spec("transformers") is not None,
                  "pins": [m["prescription"]["pins"] for m in json.loads(out.getvalue())["models"]
                           if m.get("prescription")]}}))
""")
    r = subprocess.run([str(python), str(script)], capture_output=True, text=True, env=subprocess_env(), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["transformers"] is False
    assert got["pins"] == [[{"requirement": "transformers>=5.6.0", "resolves": "GD105"}]] * 3
    assert got["calls"] == [">=5.6.0"] * 3


def test_embeddinggemma_without_transformers_is_prescribed_with_the_pin_gd423_needs(cli, tmp_path):
    """GD423 (use_bidirectional_attention unread before transformers 4.57.0) blocked every candidate where the stack
    names no transformers: "no prescription", the way out `pip install "transformers>=4.57.0"`. A pin the prescription
    needs is part of it (issue 32): prescribed with transformers>=4.57.0, and check of its YAML under that pin passes."""
    from tests.test_pitfalls import EMBEDDING_GEMMA

    folder = tmp_path / "google--embeddinggemma-300m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(EMBEDDING_GEMMA))
    reqs = _requirements(tmp_path)
    r = cli("recommend", folder, "--requirements", reqs, "--gpu", "A100", "--format", "json")
    m = r.json()["models"][0]
    assert r.code == 0 and m["prescription"]["pins"] == [{"requirement": "transformers>=4.57.0", "resolves": "GD423"}]
    config = tmp_path / "run.yaml"
    config.write_text(m["snippets"]["yaml"])
    checked = cli("check", folder, "--training-config", config, "--requirements", reqs, "--with", "transformers>=4.57.0",
                  "--gpu", "A100", "--fail-on", "warning", "--format", "json")
    assert checked.code == 0, checked.out[-3000:]
    assert "GD423" not in {f["code"] for f in checked.json()["models"][0]["findings"]}
