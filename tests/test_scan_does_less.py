"""check plans its own run only where it is shown (issue 32): where the user described no run (no training config,
nothing fixed by an option or by a checkpoint saved quantized), check's run is the prescribed one wherever the search
finds one (pipeline.with_decision), so check's own memory plan of the default run (pipeline.with_memory) is made only
where the search finds none. What is computed is counted here; that the output is the same is held here (against the
plan made eagerly, as before) and by benchmarks/output_ab.py (against main's tree, byte for byte)."""

from __future__ import annotations

import dataclasses
from itertools import product
from pathlib import Path

import pytest

from gemma_doctor import pipeline
from gemma_doctor.facts import MemoryRequest
from gemma_doctor.plan import memory, runplan
from tests.builders import build_example_cache

MODELS = ("google/gemma-3-12b-it", "google/gemma-4-E2B-it")


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("scan-less") / "hub"
    build_example_cache(cache)
    return cache


@pytest.fixture
def own_plans(monkeypatch) -> list[int]:
    """How often check plans its own run (the real pipeline.with_memory, counted)."""
    return counting(monkeypatch, pipeline, "with_memory")


def counting(monkeypatch, owner, name: str) -> list[int]:
    """``owner.name`` replaced by the real function, its calls counted in the list's one item."""
    counted = [0]
    real = getattr(owner, name)

    def spy(*args, **kwargs):
        counted[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return counted


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_no_own_plan_where_the_prescription_is_checks_run(cli, examples, own_plans, fmt) -> None:
    """With no GPU both models have a prescription, and check's run is it: check's own plan is never made."""
    r = cli("check", *MODELS, "--cache-dir", examples, "--gpu", "none", "--fail-on", "never", "--format", fmt)
    assert r.code == 0, r
    assert own_plans[0] == 0


@pytest.mark.parametrize("args", [("--gpu", "T4"), ("--gpu", "none", "--method", "lora"),
                                  ("--gpu", "none", "--batch-size", "2")])
def test_an_own_plan_where_it_is_shown(cli, examples, own_plans, args) -> None:
    """On a T4 neither model has a prescription (check's memory line is its own plan); a setting fixed by an option
    makes check's run the user's own: one plan per model in both."""
    r = cli("check", *MODELS, "--cache-dir", examples, *args, "--fail-on", "never", "--format", "json")
    assert r.code == 0, r
    assert own_plans[0] == len(MODELS)


@pytest.mark.parametrize("args", [("--gpu", "none"), ("--gpu", "T4"), ("--gpu", "A100"), ("--gpu", "L4", "--task", "dpo"),
                                  ("--gpu", "none", "--method", "qlora"), ("--gpu", "A100", "--no-gradient-checkpointing"),
                                  ("--gpu", "T4", "--seq-len", "512"), ("--gpu", "A100", "--num-gpus", "2")])
@pytest.mark.parametrize("fmt", ["text", "json", "github"])
def test_the_plan_not_made_changes_no_output(cli, examples, monkeypatch, args, fmt) -> None:
    """Every view is the same as with check's own plan made first, as it was before (fixed_settings made to say
    something is fixed takes the eager path, whose plan then says, truly, that nothing is)."""
    argv = ("check", *MODELS, "--cache-dir", examples, *args, "--fail-on", "never", "--format", fmt)
    lazy = cli(*argv)
    monkeypatch.setattr(runplan, "fixed_settings", lambda *a, **k: ("eager",))
    eager = cli(*argv)
    assert lazy.code == eager.code == 0
    assert lazy.out == eager.out and lazy.err == eager.err


REQUESTS = [MemoryRequest(method=m, batch_size=b, gradient_checkpointing=c, seq_len=s)
            for m, b, c, s in product((None, "full", "lora", "qlora"), (None, 4), (None, True, False), (None, 2048))]


@pytest.mark.parametrize("quantized", [None, ("awq", 4, 128)])
@pytest.mark.parametrize("task", ["sft", "dpo", "grpo", "lora", "full"])
def test_fixed_settings_is_the_plans_own(quantized, task) -> None:
    """runplan.fixed_settings is plan_memory's ``fixed`` without the plan, for every setting an option fixes, the
    tasks (a task that names a method fixes it; the stable RL setting is no choice of the user's) and a checkpoint
    saved quantized (its method is fixed)."""
    shape = memory.published_shape("gemma3", "12b")
    assert shape is not None
    if quantized is not None:
        shape = dataclasses.replace(shape, saved_quantization=quantized)
    for request in REQUESTS:
        kw = dict(precision="bf16", gpu=None, request=request, training_config=None, task=task)
        assert runplan.fixed_settings(shape, **kw) == runplan.plan_memory(shape, **kw).fixed, (request, task)


# --- a derived shape spells its module names only where a target is matched against them --------------------------

TARGETS = ("all-linear", ("q_proj", "v_proj"), ("self_attn.o_proj", "mlp.down_proj", "fc1"), ("layers.3.mlp.up_proj",),
           r".*language_model.*\.(q_proj|k_proj)", r"model\.layers\.1\d?\..*", r".*vision_tower.*(out_proj|fc2)",
           r"model.vision_tower.head.*", "(", ("lm_head",))


def _spelt(k: memory.Linear) -> memory.Linear:
    """``k`` with its module names spelt out, as every derived shape held them before."""
    names = k.module_names()
    return memory.Linear(k.name, k.in_features, k.out_features, len(names), names)


def _configs() -> list[tuple[str, dict]]:
    out = []
    for family, sizes in memory.PUBLISHED.items():
        for size, config in sizes.items():
            out.append((f"{family}-{size}", config))
    return out


@pytest.mark.parametrize("name,config", _configs(), ids=[n for n, _ in _configs()])
def test_a_derived_shape_spells_no_text_module_names(name, config) -> None:
    """The text decoder's Linears of a shape derived from config.json hold their layout, not a name per layer: a scan
    plans every model, and only a LoRA target that is not "all-linear" reads the names (Linear.matched)."""
    shape = memory.shape_from_config(config)
    assert shape.linears and all(k.names == () and k.layout is not None for k in shape.linears), name


@pytest.mark.parametrize("name,config", _configs(), ids=[n for n, _ in _configs()])
def test_the_layout_matches_as_the_names_did(name, config) -> None:
    """Every target (a regex PEFT reads whole, names, dotted suffixes, a regex PEFT refuses) matches the layout's
    Linears as it matches the same Linears with every name spelt out; the count of each kind is its names'."""
    shape = memory.shape_from_config(config)
    for k in shape.linears + shape.tower_linears:
        spelt = _spelt(k)
        assert spelt.count == k.count and len(set(spelt.names)) == k.count
        for t in TARGETS:
            assert k.matched(t) == spelt.matched(t), (name, k.name, t)


def test_a_kind_the_vision_head_shares_has_both_names() -> None:
    """SigLIP's attention-pooling head has an out_proj, fc1 and fc2 of the encoder's shape: one Linear each, with the
    encoder's layers' names and the head's (as before); the encoder's other kinds keep their layout."""
    vision = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "vision_use_head": True}
    _total, linears = memory._siglip_params(vision)
    by = {k.name: k for k in linears}
    assert by["out_proj"].count == 28 and by["out_proj"].names[-1] == "model.vision_tower.head.attention.out_proj"
    assert by["fc1"].names[:2] == ("model.vision_tower.encoder.layers.0.mlp.fc1",
                                    "model.vision_tower.encoder.layers.1.mlp.fc1")
    assert by["q_proj"].names == () and by["q_proj"].module_names()[26] == \
        "model.vision_tower.encoder.layers.26.self_attn.q_proj"


# --- a view without the prescription names no snippets ------------------------------------------------------------

@pytest.fixture
def namings(monkeypatch) -> list[int]:
    """How often a snippet's value is named (the real report.Naming.value, counted at its outermost calls)."""
    from gemma_doctor import report

    counted = [0]
    real = report.Naming.value

    def spy(self, v, _depth=[0]):
        if _depth[0] == 0:
            counted[0] += 1
        _depth[0] += 1
        try:
            return real(self, v)
        finally:
            _depth[0] -= 1

    monkeypatch.setattr(report.Naming, "value", spy)
    return counted


@pytest.mark.parametrize("fmt", ["text", "github"])
@pytest.mark.parametrize("gpu", ["none", "T4"])
def test_a_view_without_the_prescription_names_no_snippets(cli, examples, namings, fmt, gpu) -> None:
    """check's text and github views show the precision line and the findings, never a framework's settings: the
    recommendations' snippets are left out, not named (each model's ~100 settings, in a scan of every model)."""
    r = cli("check", *MODELS, "--cache-dir", examples, "--gpu", gpu, "--fail-on", "never", "--format", fmt)
    assert r.code == 0, r
    assert namings[0] == 0


def test_the_json_view_names_its_snippets(cli, examples, namings) -> None:
    r = cli("check", *MODELS, "--cache-dir", examples, "--gpu", "none", "--fail-on", "never", "--format", "json")
    assert r.code == 0, r
    assert namings[0] > 0
    models = r.json()["models"]
    assert all(m["recommendation"]["frameworks"]["axolotl"]["base_model"] == m["repo_id"] for m in models)


@pytest.mark.parametrize("args", [("--gpu", "none"), ("--gpu", "T4"), ("--gpu", "A100", "--method", "lora"),
                                  ("--gpu", "T4", "--with", "transformers==4.50.3")])
@pytest.mark.parametrize("fmt", ["text", "github"])
def test_snippets_left_out_change_no_output(cli, examples, monkeypatch, args, fmt) -> None:
    """The text and github views are the same as with every snippet named (as before)."""
    argv = ("check", *MODELS, "--cache-dir", examples, *args, "--fail-on", "never", "--format", fmt)
    lazy = cli(*argv)
    real = pipeline.named
    monkeypatch.setattr(pipeline, "named", lambda judgement, snippets=True: real(judgement))
    eager = cli(*argv)
    assert lazy.code == eager.code == 0
    assert lazy.out == eager.out and lazy.err == eager.err


# --- a repo without an undo record ---------------------------------------------------------------------------------

def test_no_undo_key_is_worked_out_without_a_record(cli, examples, monkeypatch) -> None:
    """A repo `fix` never touched has no undo record: the snapshot's record key (a path made relative to the repo
    folder, per model of a scan) is not worked out; with a record it is, and restore still finds its entries
    (tests/test_restore.py)."""
    from gemma_doctor import undo

    counted = counting(monkeypatch, undo, "entry_key")
    r = cli("check", *MODELS, "--cache-dir", examples, "--fail-on", "never")
    assert r.code == 0, r
    assert counted[0] == 0


# --- list shows no prescription, sizes without resolving paths, and names "see why" where a hint does -----------------

def test_list_makes_no_prescription(cli, examples, monkeypatch) -> None:
    """A row shows check's findings as a status, never the prescription: list judges as check's text view does, so
    no search of it explains itself (no way out, no prescribed Run, no YAML) and no snippet is named."""
    from gemma_doctor import report
    from gemma_doctor.plan import search

    explained: list[bool] = []
    real = search.prescribe

    def spy(*args, **kwargs):
        explained.append(kwargs.get("explain", True))
        return real(*args, **kwargs)

    monkeypatch.setattr(search, "prescribe", spy)
    yamls = counting(monkeypatch, search.recommend, "training_config_yaml")
    named = counting(monkeypatch, report.Naming, "value")
    for args in ((), ("--with", "transformers==4.50.3")):
        r = cli("list", "--cache-dir", examples, "--format", "json", *args)
        assert r.code == 0, r
    assert explained and not any(explained)
    assert yamls[0] == 0 and named[0] == 0


def test_list_sizes_without_resolving_each_link(examples, monkeypatch) -> None:
    """A row's size counts each blob once by the one stat of each file (device and inode), not by resolving every
    link's path component by component (os.path.realpath, a stat per component); the figure is the blobs' bytes."""
    import os

    from gemma_doctor import listing

    snap = next((examples / "models--google--gemma-3-12b-it" / "snapshots").iterdir())
    blobs = {os.path.realpath(p) for p in snap.rglob("*") if p.is_file()}
    resolved = counting(monkeypatch, os.path, "realpath")
    size = listing.snapshot_size(snap)
    assert resolved[0] == 0
    assert size == sum(os.stat(b).st_size for b in blobs) > 0


def test_list_names_see_why_only_for_the_rows_a_hint_names(examples) -> None:
    """`gemma-doctor check ...` ("see why with") is made for a row that needs a fix or cannot be read, the rows a
    hint or a next step names; every other row gets none (a cache of a thousand ok rows made a thousand)."""
    from gemma_doctor import listing

    rows, _ = listing.collect(examples)
    quiet = [r for r in rows if r.status not in (listing.RowStatus.NEEDS_FIX, listing.RowStatus.ERROR)]
    assert quiet and all(r.check_command is None for r in quiet)
    assert all(r.check_command for r in rows if r.status in (listing.RowStatus.NEEDS_FIX, listing.RowStatus.ERROR))


# --- a model served a shared judgement is copied field for field ----------------------------------------------------

def _alike(hub, n: int) -> None:
    from tests.builders import gemma3_12b_config, generation_config, variant

    for i in range(n):
        repo = f"team/tune-{i}"
        hub.add(repo, {"config.json": variant(gemma3_12b_config(), _name_or_path=repo),
                       "generation_config.json": generation_config()})


@pytest.mark.parametrize("prescription", [False, True])
@pytest.mark.parametrize("work", ["replace", "fields"])
def test_a_served_model_is_copied_without_dataclasses_replace(tmp_path, monkeypatch, prescription, work) -> None:
    """A whole-cache scan of models equal but for their names judges one and serves the rest (gemma_doctor/memo.py);
    each served model's copies (its files made name-free, its judgement named, its text block) are frozen.replace's,
    which assigns the fields, not dataclasses.replace's, which checks every field and runs __init__: the calls to
    dataclasses.replace do not grow with the models served (main: 6 more per model, 2 of them JsonFile's). Nor do
    dataclasses.fields': the fields a judgement filled in are found once per memo entry, not per model served."""
    from gemma_doctor.facts import CheckOptions
    from gemma_doctor.render.text import with_block
    from tests.builders import HubCache

    monkeypatch.setenv("GEMMA_DOCTOR_WORKERS", "1")
    calls = counting(monkeypatch, dataclasses, work)
    counts = {}
    for n in (2, 3, 6):  # the first scan warms what a process keeps (tables parsed once), counted by no other
        cache = tmp_path / f"c{n}"
        _alike(HubCache(cache), n)
        calls[0] = 0
        report = pipeline.diagnose([], cache, options=CheckOptions(), finish=with_block,
                                   prescription=prescription)
        assert len(report.models) == n and all(m.block is not None for m in report.models)
        counts[n] = calls[0]
    assert counts[6] == counts[3]


def test_a_served_model_is_never_made_name_free(tmp_path, monkeypatch) -> None:
    """A model whose key is in the memo is served by its key alone: its name-free facts (a neutral snapshot, its files
    copied with neutral paths and text, the facts copied around them) are made only for a model whose key is new, the
    one judged so (main: made for every model whose config text was met before, 5 for 6 alike models, 2 for 3)."""
    from gemma_doctor import memo
    from gemma_doctor.facts import CheckOptions
    from tests.builders import HubCache

    monkeypatch.setenv("GEMMA_DOCTOR_WORKERS", "1")
    made = counting(monkeypatch, memo, "Snapshot")  # name-free facts start with "this model"'s neutral snapshot
    counts = {}
    for n in (2, 3, 6):
        cache = tmp_path / f"c{n}"
        _alike(HubCache(cache), n)
        made[0] = 0
        report = pipeline.diagnose([], cache, options=CheckOptions(), prescription=False)
        assert len(report.models) == n
        counts[n] = made[0]
    assert counts[6] == counts[3] == counts[2] == 1


def _config_text(name_json: str, rest: str = '"note": "x"') -> bytes:
    """A Gemma 3 config as text, its own ``_name_or_path`` written as ``name_json`` (a JSON string as written)."""
    import json

    from tests.builders import gemma3_12b_config

    body = json.dumps({k: v for k, v in gemma3_12b_config().items() if k != "_name_or_path"})
    return ('{"_name_or_path": ' + name_json + ", " + rest + ", " + body[1:]).encode()


# (repo, config.json's text): pairs equal but for the repo's own name, and texts that only look alike once made neutral
_TEXTS = (
    ("a/one", _config_text('"a/one"')), ("b/two", _config_text('"b/two"')),  # equal but for their names
    ("c/three", _config_text('"c/three"', '"note": "\\u0078"')),  # an escape: the parse stays in the key
    ("d/four", _config_text('"d/four"', '"note": "\\u0078"')),
    # the name written escaped, and as it is under another key: that key's value is what the text makes neutral
    ("e/five", _config_text('"\\u0078"', '"note": "x"')), ("f/six", _config_text('"\\u0079"', '"note": "y"')),
    ("g/seven", _config_text('"x"', '"note": "\\u0078"')),
    ("h/eight", _config_text('"\\u27e8name-or-path\\u27e9"')),  # the neutral name itself
    ("i/nine", b'{"model_type": "gemma3_text", "_name_or_path": 7}'),  # a name that is not text
    ("j/ten", b'{"model_type": "gemma3_text", "_name_or_path": 7.0}'),
)


def test_a_key_made_without_the_name_free_facts_is_theirs(tmp_path) -> None:
    """memo.key_parts makes a model's key without its name-free facts, and with a JSON file's text standing for its
    parse where the parse is a function of it. Equal keys are equal name-free facts, pickled whole (every field with
    its type, dicts in their order: the key as it was made of them), over configs whose own name is a plain value,
    written escaped with the name under another key, the neutral name itself, or not text; and models whose texts hold
    no escape share a key wherever those facts are equal (a text with one keeps its parse in the key: a key apart,
    never a judgement shared that should not be)."""
    import pickle

    from gemma_doctor import locate, memo
    from gemma_doctor.facts import CheckOptions
    from gemma_doctor.readers import parsed
    from tests.builders import HubCache, generation_config

    hub = HubCache(tmp_path / "hub")
    for repo, text in _TEXTS:
        hub.add(repo, {"config.json": text, "generation_config.json": generation_config()})
    with parsed.sharing():
        models, _ = pipeline.select(locate.resolve([], hub.root, "main", False), explicit=False)
        keys, whole = {}, {}
        for m in models:
            f = pipeline.read_more(m, CheckOptions())
            neutral, parts = memo.name_free(f)
            keys[m.snapshot.repo_id] = memo.key_of(parts, f)
            whole[m.snapshot.repo_id] = pickle.dumps((parts[0], parts[1], neutral.with_(snapshot=None, source=None)))
    assert len(keys) == len(_TEXTS)
    plain = {repo for repo, text in _TEXTS if b"\\" not in text}
    for a, b in product(keys, keys):
        assert keys[a] != keys[b] or whole[a] == whole[b], (a, b)
        assert not (a in plain and b in plain and whole[a] == whole[b]) or keys[a] == keys[b], (a, b)
    assert keys["a/one"] == keys["b/two"] and keys["c/three"] == keys["d/four"] != keys["a/one"]
    assert len({keys[r] for r in ("e/five", "f/six", "g/seven", "h/eight", "i/nine", "j/ten")}) == 6
    # Where the text stands for the parse: the plain pair; the escaped one keeps its parse (where key_of looks for names)
    at = memo._KEYED_FIELDS.index("config")
    config = memo.key_parts(pipeline.read_more(models[0], CheckOptions()))[2][at]
    assert memo._OF_TEXT in config and models[0].snapshot.repo_id == "a/one"
    escaped = [m for m in models if m.snapshot.repo_id == "c/three"][0]
    assert memo._OF_TEXT not in memo.key_parts(pipeline.read_more(escaped, CheckOptions()))[2][at]
