"""Issue 23's speed-ups change how the work is done, never what is found: each cut here is checked against the plain
computation it replaces (no test asserts on time; the figures are in docs/benchmarks.md)."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from gemma_doctor.plan import search
from gemma_doctor.readers import training_config as tc_reader
from gemma_doctor.readers.training_config import TrainingConfig


def _reference_parse(text: str, path: str) -> TrainingConfig:
    """The YAML path of the reader as it was: yaml.safe_load, then the key lines from a second yaml.compose."""
    real = yaml.safe_load

    def old_lines(t: str) -> dict[str, int]:
        out: dict[str, int] = {}

        def walk(node, prefix, depth):
            if depth > 3 or not isinstance(node, yaml.MappingNode):
                return
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    dotted = prefix + str(k.value)
                    out.setdefault(dotted, k.start_mark.line + 1)
                    walk(v, dotted + ".", depth + 1)

        try:
            walk(yaml.compose(t, Loader=yaml.SafeLoader), "", 1)
        except yaml.YAMLError:
            pass
        return out

    tc = tc_reader.parse(text, path, yaml_first=True)
    try:
        data = real(text)
    except yaml.YAMLError:
        return tc  # the error path is unchanged: the reader's own message
    if not isinstance(data, dict):
        return tc
    lines = old_lines(text)
    # Every setting's line must be the line the two-pass reader gave it.
    return TrainingConfig(tc.path, tc.kind, {n: tc_reader.Setting(s.key, s.value, lines.get(s.key))
                                             for n, s in tc.settings.items()}, tc.error, trainer=tc.trainer)


YAML_TEXTS = [
    "bf16: true\nper_device_train_batch_size: 4\nmax_length: 2048\n",
    # A merge key that the file overrides: the line is the file's own key (line 5), not the merged one (line 2). Read
    # from nodes already constructed (which flattens merges in place) it would be line 2.
    "base: &b\n  bf16: false\n  per_device_train_batch_size: 4\n<<: *b\nbf16: true\n",
    "<<: {fp16: true, gradient_checkpointing: true}\nbase_model: google/gemma-3-1b-it\nmicro_batch_size: 2\n",
    "model_init_kwargs:\n  torch_dtype: bfloat16\n  quantization_config:\n    load_in_4bit: true\nbf16: true\n",
    "zero_optimization:\n  stage: 3\n  offload_optimizer: {device: cpu}\nbf16: {enabled: true}\n",
    "# comment only\n---\nfp16: yes\n",
    "- a list\n- of things\n",
    "",
    "bf16: [unclosed\n",
    "a: &x [*x]\n",
    "rl: dpo\nbeta: 0.1\nloss_type: sigmoid\n",
]


@pytest.mark.parametrize("text", YAML_TEXTS)
def test_yaml_read_once_gives_what_two_passes_gave(text):
    got = tc_reader.parse(text, "train.yaml", yaml_first=True)
    assert got == _reference_parse(text, "train.yaml")


def test_merge_key_override_keeps_the_files_own_line():
    tc = tc_reader.parse(YAML_TEXTS[1], "train.yaml", yaml_first=True)
    assert tc.get("bf16").value is True and tc.get("bf16").line == 5


@pytest.mark.parametrize("repo_id", ["org0/model-00001", "google/gemma-3-12b-it", "a.b_c-d/E.F", "",
                                     'we\\"ird', "caf\u00e9/x", "x/y\nmicro_batch_size: 1"])
def test_a_prescription_as_read_is_the_reader_on_its_yaml(repo_id):
    """The training config the search judges (built from the run, after another repo's of the same run) is exactly
    what the reader gives on the YAML recommend prints, whatever the repo id (one that would break a line is escaped
    by the YAML, so it never changes a setting)."""
    from gemma_doctor.plan import recommend

    from gemma_doctor.run import Settings

    advice = Settings(method="lora", batch_size=8, gradient_accumulation_steps=2, gradient_checkpointing=True,
                      seq_len=1024)
    first = recommend.decide(recommend.Inputs(family="gemma3", gpu_native_bf16=True, model_id="org0/model-00000",
                                              settings=advice))
    search.as_read(first)
    rec = recommend.decide(recommend.Inputs(family="gemma3", gpu_native_bf16=True, model_id=repo_id, settings=advice))
    text = recommend.training_config_yaml(rec)
    want = tc_reader.parse(text, search.PRESCRIPTION, yaml_first=True)
    assert repr(search.as_read(rec)) == repr(want) and want.get("batch_size").value == 8


# --- the quick judge: candidates rejected by the first (cheapest) rule that flags them ------------------------------

@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    import subprocess
    import sys
    from pathlib import Path

    cache = tmp_path_factory.mktemp("examples") / "hub"
    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, str(root / "examples" / "build_example_cache.py"), str(cache)], check=True,
                   capture_output=True)
    return cache


SCENARIOS = [
    ("check",),  # the whole cache, no GPU: candidates rejected by GD650 until the batch is small enough
    ("check", "--gpu", "T4"),
    ("check", "--gpu", "A100", "--task", "dpo"),
    ("check", "--gpu", "H100", "--with", "transformers==5.5.1"),  # Gemma 3: no prescription (GD105 on every run)
    # No prescription either, and the large batches also get GD650: the nearest is the first run with the fewest
    # blocking findings counted by every rule (the quick judge saw one finding on each).
    ("check", "--with", "transformers==5.5.1"),
    ("check", "--gpu", "L4", "--with", "transformers==4.50.0", "--task", "qlora"),
    ("recommend", "google/gemma-3-12b-it", "--gpu", "A100", "--with", "transformers==5.5.1"),
    ("recommend", "google/gemma-4-E2B-it", "--gpu", "T4"),
    ("list",),
]


@pytest.mark.parametrize("args", SCENARIOS, ids=" ".join)
def test_quick_judge_prescribes_what_every_rule_on_every_candidate_did(cli, examples, monkeypatch, args):
    fmt = ("--format", "json") if args[0] != "list" else ("--format", "json")
    extra = ("--fail-on", "never") if args[0] == "check" else ()
    got = cli(*args, "--cache-dir", examples, *fmt, *extra)
    assert got.out.strip()
    real = search._judge

    def every_rule(*a, **k):
        """The quick judge off: every rule run on every candidate, a candidate rejected by all its findings."""
        j = real(*a, **{**k, "quick": False})()
        if j.blocking:
            return search._Rejected(j.plan, j.recommendation, j.checked, j.findings, j.shape, j.request,
                                    lambda: j)
        return lambda: j

    monkeypatch.setattr(search, "_judge", every_rule)
    monkeypatch.setattr(search, "_WAY_OUTS", {})  # the way out searched again with every rule, not remembered
    want = cli(*args, "--cache-dir", examples, *fmt, *extra)
    assert (got.code, got.out) == (want.code, want.out)
    if args[0] != "list":
        assert '"prescription"' in got.out


# --- the catalogue's entries left out per stack, the horizon remembered per stack ----------------------------------

def test_catalogue_findings_are_every_entrys_own(cli, tmp_path, monkeypatch):
    """Each catalogue entry's positive and negative example (its own stack, GPU, training config) through the real
    check: the findings are those of evaluating every entry, as before entries were left out per stack."""
    from gemma_doctor import catalogue
    from gemma_doctor.rules import catalogue as rule
    from tests.test_catalogue import write_inputs

    fired = 0
    for n, entry in enumerate(catalogue.coded()):
        for kind in ("positive", "negative"):
            args = write_inputs(tmp_path / f"{n}-{kind}", entry["examples"][kind])
            got = cli(*args, "--format", "json", "--fail-on", "never")
            with monkeypatch.context() as m:
                m.setattr(rule, "_live", lambda entries, stack: entries)
                want = cli(*args, "--format", "json", "--fail-on", "never")
            assert (got.code, got.out) == (want.code, want.out), (entry["code"], kind)
            fired += entry["code"] in got.out
    assert fired >= len(catalogue.coded())  # not an empty comparison: every entry fires on its positive example


@pytest.mark.parametrize("with_", [(), ("transformers==9.0.0",), ("transformers>=5.0",)])
def test_horizon_remembered_per_stack_is_the_horizon(with_):
    from gemma_doctor import horizon, pipeline
    from gemma_doctor.facts import CheckOptions

    stack = pipeline.environment(CheckOptions(with_packages=with_)).libraries
    assert horizon.beyond(stack) == horizon._beyond(stack) == horizon.beyond(stack)
    assert horizon.beyond(stack) is not horizon.beyond(stack)  # a fresh list each time: callers may change theirs


# --- candidates made once per architecture -------------------------------------------------------------------------

@pytest.mark.parametrize("family,size,gpu_bytes", [("gemma3", "12b", None), ("gemma3", "1b", 16 * 2**30),
                                                   ("gemma4", "e2b", 24 * 2**30), ("gemma2", "9b", 80 * 2**30)])
def test_candidates_remembered_are_the_candidates(family, size, gpu_bytes):
    from dataclasses import replace

    from gemma_doctor.plan import memory, runplan
    from gemma_doctor.run import Settings

    shape = memory.published_shape(family, size)
    req = runplan.request_spec(precision="bf16", gpu=None, request=runplan.MemoryRequest(),
                               training_config=None, task="sft")
    req = replace(req, gpu_bytes=gpu_bytes)
    for accept in (("fits",), ("tight",)):
        want = list(search._candidates(shape, req, accept))
        assert want  # not an empty comparison
        search._CANDIDATES.clear()
        a, b = search.candidates(shape, req, accept), search.candidates(shape, req, accept)
        got_a, got_b = [next(a)], []
        got_b += [next(b), next(b)] if len(want) > 1 else [next(b)]  # b runs ahead of a, then a reads b's plans
        got_a += list(a)
        got_b += list(b)
        assert got_a == want and got_b == want and list(search.candidates(shape, req, accept)) == want


@pytest.mark.parametrize("family,size,gpu_bytes", [("gemma3", "12b", None), ("gemma3", "1b", 16 * 2**30),
                                                   ("gemma4", "e2b", 24 * 2**30), ("gemma2", "9b", 80 * 2**30)])
def test_plan_with_new_sources_is_the_plan_made_again(family, size, gpu_bytes):
    """memory.with_sources (runplan._finish's relabelling) makes only the source-dependent assumption lines again: the
    result equals plan() of the relabelled run, for every candidate run (methods, QLoRA notes, ZeRO lines, RL tasks),
    and for a plan not as plan() made it."""
    from dataclasses import replace

    from gemma_doctor.plan import memory, runplan
    from gemma_doctor.run import Settings

    shape = memory.published_shape(family, size)
    checked = 0
    for task in ("sft", "dpo"):
        for n in (1, 4):
            req = runplan.request_spec(precision="bf16", gpu=None, request=runplan.MemoryRequest(
                num_gpus=n), training_config=None, task=task)
            req = replace(req, gpu_bytes=gpu_bytes)
            for p in search._candidates(shape, req, ("fits", "tight", "does-not-fit")):
                sources = tuple(sorted({**dict(p.settings.sources), "method": "chosen by the search",
                                        "lora": "chosen by the search", "seq_len": "--seq-len"}.items()))
                run = replace(p.settings, sources=sources)
                want = replace(p, settings=run, assumptions=memory.plan(shape, run, gpu_bytes, None).assumptions)
                assert memory.with_sources(p, shape, sources, gpu_bytes, None) == want
                relabelled = replace(p, settings=replace(p.settings, sources=(("method", "x"),)), assumptions=p.assumptions + ("y",))
                assert memory.with_sources(relabelled, shape, sources, gpu_bytes, None) == want
                checked += 1
    assert checked > 20


@pytest.mark.parametrize("text", YAML_TEXTS[:5])
def test_request_remembered_is_the_request(text):
    """runplan._request_spec (plan_memory's request, remembered per process) is request_spec's own answer for each
    training config and GPU, however many times it is asked and in whatever order."""
    from gemma_doctor.plan import runplan
    from gemma_doctor.readers import gpu as gpu_reader

    tc = tc_reader.parse(text, "t.yaml", yaml_first=True)
    asks = [("bf16", gpu_reader.resolve(g), runplan.MemoryRequest(**r), c, task, targets, chunks)
            for g in (None, "A100", "T4") for r in ({}, {"batch_size": 2}, {"gpu_memory": 8 * 2**30})
            for c in (tc, None) for task in ("sft", "dpo") for targets in (None, "all-linear")
            for chunks in (False, True)]
    runplan._REQUESTS.clear()
    for ask in asks + asks[::-1]:
        want = runplan.request_spec(precision=ask[0], gpu=ask[1], request=ask[2], training_config=ask[3], task=ask[4],
                                    lora_targets=ask[5], trl_chunks=ask[6])
        assert runplan._request_spec(*ask) == want


def test_frozen_replace_is_dataclasses_replace():
    """frozen.replace (the copies the search makes per candidate) gives what dataclasses.replace gives: equal fields in
    the same order, nothing else of the old object carried over; __post_init__ classes and unknown names go the
    dataclasses way (validation, TypeError)."""
    import dataclasses

    from gemma_doctor import frozen
    from gemma_doctor.errors import UsageError
    from gemma_doctor.plan import memory, runplan
    from gemma_doctor.run import Settings

    shape = memory.published_shape("gemma3", "1b")
    p = memory.plan(shape, Settings(method="lora"), 16 * 2**30, None)
    for obj, changes in ((p.settings, {"batch_size": 2, "attention": "eager"}), (p, {"assumptions": ("x",)}),
                         (p, {})):
        got, want = frozen.replace(obj, **changes), dataclasses.replace(obj, **changes)
        assert got == want and type(got) is type(want) and list(vars(got)) == list(vars(want))
        assert [getattr(got, f.name) for f in dataclasses.fields(got)] == [getattr(want, f.name) for f in dataclasses.fields(want)]
    assert "_source_lines" in vars(p) and "_source_lines" not in vars(frozen.replace(p, gpu_name="x"))
    with pytest.raises(UsageError):  # MemoryRequest validates in __post_init__: not skipped
        frozen.replace(runplan.MemoryRequest(), method="nope")
    with pytest.raises(TypeError):
        frozen.replace(p.settings, no_such_field=1)


class _Upper:
    """A data descriptor: what a field is set to, stored upper-cased under another name."""

    def __set_name__(self, owner, name):  # noqa: ANN001, ANN204
        self.name = "_" + name

    def __get__(self, obj, owner=None):  # noqa: ANN001, ANN204
        return "default" if obj is None else obj.__dict__[self.name]

    def __set__(self, obj, value):  # noqa: ANN001, ANN204
        obj.__dict__[self.name] = value.upper()


@dataclasses.dataclass(frozen=True)
class _OwnInit:
    x: int

    def __init__(self, x: int) -> None:
        object.__setattr__(self, "x", x * 2)


@dataclasses.dataclass(frozen=True)
class _OwnNew:
    x: int

    def __new__(cls, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204
        obj = super().__new__(cls)
        object.__setattr__(obj, "made", True)
        return obj


@dataclasses.dataclass(frozen=True)
class _DescriptorField:
    x: str = _Upper()  # type: ignore[assignment]


@dataclasses.dataclass(frozen=True)
class _Plain:
    x: int


class _SubclassInit(_Plain):
    def __init__(self, x: int) -> None:
        super().__init__(x + 1)


@pytest.mark.parametrize("cls, arg", [(_OwnInit, 1), (_OwnNew, 1), (_DescriptorField, "a"), (_SubclassInit, 1)],
                         ids=["own-init", "own-new", "data-descriptor-field", "subclass-init"])
def test_frozen_replace_refuses_by_construction_a_class_whose_init_does_more(cls, arg):
    """frozen._plain refuses a class with an __init__ of its own (or a subclass's), a __new__, or a field behind a data
    descriptor: copying its fields into a new __dict__ would skip what they do, so its copies are dataclasses.replace's.
    Before, only a guard test over today's classes (test_hostile_scan_round13) stood in the way: frozen.replace gave
    x=2 where dataclasses.replace gives x=4, lost the mark __new__ sets, or raised KeyError for the descriptor's field."""
    from gemma_doctor import frozen

    assert frozen._plain(cls) is None
    obj = cls(arg)
    got, want = frozen.replace(obj), dataclasses.replace(obj)
    assert vars(got) == vars(want) and got == want
    assert frozen._plain(_Plain) is not None  # a plain class keeps the fast copy


def test_prescriptions_read_with_libyaml_read_as_with_pure_python(cli, examples, monkeypatch):
    """The read-back of every training config the search renders or judges (every scenario above) composes with libyaml's
    parser; the settings and their lines are those of the pure-Python parser a user's file is read with."""
    from gemma_doctor.plan import recommend

    assert yaml.__with_libyaml__  # else the C path is never taken and this compares nothing
    texts: list[str] = []
    real = recommend.training_config_yaml

    def record(rec):
        texts.append(real(rec))
        return texts[-1]

    monkeypatch.setattr(recommend, "training_config_yaml", record)
    real_as_read = search.as_read

    def judged(rec):  # every candidate the search judges, rendered as the prescription would be (a way out's search
        texts.append(real(rec))  # renders no YAML of its own: only its memory plan is shown)
        return real_as_read(rec)

    monkeypatch.setattr(search, "as_read", judged)
    monkeypatch.setattr(search, "_WAY_OUTS", {})  # every way out searched here, each judging its candidates
    for args in SCENARIOS:
        extra = ("--fail-on", "never") if args[0] == "check" else ()
        cli(*args, "--cache-dir", examples, "--format", "json", *extra)
    # 9 distinct texts since the YAML stopped writing `use_cache: true` (no axolotl key) for Gemma 4 on 5.5.1
    assert len(set(texts)) > 8
    for text in set(texts):
        fast = tc_reader.parse(text, search.PRESCRIPTION, yaml_first=True, c_yaml=True)
        assert fast == tc_reader.parse(text, search.PRESCRIPTION, yaml_first=True) and fast.ok and fast.settings


@pytest.mark.parametrize("text", ["5.23.0", "4.50.0.dev0", "2.13.0+cpu", "1.0rc1", "0.21.2.post1", "not-a-version"])
def test_versions_parsed_once_are_versions(text):
    from packaging.version import InvalidVersion, Version

    from gemma_doctor import stack, versioning

    try:
        want = Version(text)
    except InvalidVersion:
        with pytest.raises(InvalidVersion):
            stack.version_of(text)
        assert versioning.parse(text) is None
        return
    assert stack.version_of(text) == want and stack.version_of(text) is stack.version_of(text)
    assert versioning.parse(text) == want and str(versioning.parse(text)) == str(want)


# --- a model's judgement remembered across models equal but for their names (gemma_doctor/memo.py) -----------------

def _weights(dtype: str) -> bytes:
    """A valid safetensors file of two small tensors (Gemma 3 names) in ``dtype``."""
    import json

    width = {"BF16": 2, "F32": 4}[dtype]
    tensors, offset = {}, 0
    for name, n in (("language_model.model.embed_tokens.weight", 64), ("language_model.model.norm.weight", 8)):
        tensors[name] = {"dtype": dtype, "shape": [n], "data_offsets": [offset, offset + width * n]}
        offset += width * n
    header = json.dumps(tensors).encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + b"\0" * offset


@pytest.fixture
def fine_tunes(tmp_path):
    """Six fine-tunes of one base: tune-2, tune-5 and tune-6 equal to tune-1 but for their names, tune-3 differing in
    one config value that no rule looks at, tune-4 in one tensor's dtype; and a Llama."""
    from tests.builders import HubCache, gemma3_12b_config, generation_config, llama_config, variant

    hub = HubCache(tmp_path / "hub")
    cfg, gen = gemma3_12b_config(), generation_config()
    for repo, config, weights in (("org-a/tune-1", cfg, _weights("BF16")), ("org-b/tune-2", cfg, _weights("BF16")),
                                  ("org-a/tune-3", variant(cfg, boi_token_index=255998), _weights("BF16")),
                                  ("org-c/tune-4", cfg, _weights("F32")), ("org-d/tune-5", cfg, _weights("BF16")),
                                  ("org-d/tune-6", cfg, _weights("BF16"))):
        hub.add(repo, {"config.json": variant(config, _name_or_path=f"/home/me/runs/{repo.split('/')[1]}"),
                       "generation_config.json": gen, "model.safetensors": weights})
    # An older revision of tune-1, its config naming the repo itself: checked with --all-revisions.
    hub.add("org-a/tune-1", {"config.json": variant(cfg, _name_or_path="org-a/tune-1"), "generation_config.json": gen,
                             "model.safetensors": _weights("BF16")}, refs=("v1",))
    hub.add("meta/llama", {"config.json": llama_config()})
    return hub.root


def _decisions(monkeypatch) -> list[str]:
    """The repos judged (pipeline.decide): the first model of some config text as it is, the first of some name-free
    facts as "this model" (report.MODEL_ID, its judgement then kept), any further one not at all."""
    from gemma_doctor import pipeline

    judged: list[str] = []
    real = pipeline.decide

    def decide(facts, options, env, *more, **named):
        judged.append(facts.snapshot.repo_id)
        return real(facts, options, env, *more, **named)

    monkeypatch.setattr(pipeline, "decide", decide)
    return judged


def test_models_equal_but_for_their_names_share_one_judgement_and_no_other(cli, fine_tunes, monkeypatch):
    judged = _decisions(monkeypatch)
    from gemma_doctor.report import MODEL_ID

    got = cli("check", "--cache-dir", fine_tunes, "--format", "json", "--fail-on", "never")
    # tune-1 judged as it is (the first of its config text), tune-2 as "this model" (the judgement kept), tune-5 and
    # tune-6 served that; tune-3 (one config value) judged on its own, tune-4 (one dtype) as "this model" of its own.
    assert sorted(judged) == sorted(["org-a/tune-1", MODEL_ID, "org-a/tune-3", MODEL_ID])
    monkeypatch.setenv("GEMMA_DOCTOR_NO_MEMO", "1")
    judged.clear()
    want = cli("check", "--cache-dir", fine_tunes, "--format", "json", "--fail-on", "never")
    assert len(judged) == 6 and "\u27e8" not in want.out and "\u27e8" not in got.out
    assert (got.code, got.out) == (want.code, want.out)
    import json

    models = {m["repo_id"]: m for m in json.loads(got.out)["models"]}
    # What names the repo is the repo's own: the snippets and the prescription's training config.
    for own in ("org-b/tune-2", "org-d/tune-5", "org-d/tune-6"):
        text = json.dumps(models[own])
        assert own in json.dumps(models[own]["recommendation"]) and "org-a/tune-1" not in text
    assert models["org-c/tune-4"]["dtypes"] != models["org-a/tune-1"]["dtypes"]


def _keys(root, revisions: bool = False) -> dict[tuple[str, str], bytes]:
    """Each model's memo key (its name-free facts' digest), read as a scan reads them (headers digested)."""
    from gemma_doctor import locate, memo, pipeline
    from gemma_doctor.facts import CheckOptions
    from gemma_doctor.readers import parsed

    keys = {}
    with parsed.sharing():
        models, _ = pipeline.select(locate.resolve([], root, "main", revisions), explicit=False)
        for m in models:
            f = pipeline.read_more(m, CheckOptions())
            assert memo.shareable(f), m.snapshot.target
            keys[(m.snapshot.repo_id, m.snapshot.revision)] = memo.key_of(memo.name_free(f)[1], f)
    return keys


def test_one_fact_apart_is_another_key(fine_tunes):
    """The memo key of each fine-tune: equal for the four equal but for their names (whatever their configs' own
    _name_or_path says: a name, which no rule reads), different for one config value and one tensor dtype."""
    keys = _keys(fine_tunes, revisions=True)
    one = keys[("org-a/tune-1", "main")]
    assert keys[("org-b/tune-2", "main")] == one == keys[("org-d/tune-5", "main")] == keys[("org-d/tune-6", "main")]
    assert keys[("org-a/tune-3", "main")] != one
    assert keys[("org-c/tune-4", "main")] != one
    # Another revision: the ref a scan names stays in the key (named() writes it into commands; kept rather than proven
    # unread), whatever the config's own _name_or_path says (the repo itself there, a folder on main).
    assert keys[("org-a/tune-1", "v1")] != one


def test_one_judgement_is_made_for_models_equal_but_for_their_names(fine_tunes):
    """Counted by the scan's memo itself: of the six fine-tunes, tune-2, tune-5 and tune-6 (equal to tune-1 but for
    their names) get one judgement, made once and served twice; tune-4 (one dtype apart) one of its own."""
    from gemma_doctor import locate, memo, pipeline
    from gemma_doctor.facts import CheckOptions
    from gemma_doctor.readers import parsed

    options = CheckOptions()
    env = pipeline.environment(options)
    remembered = memo.Memo(env, options)
    with parsed.sharing():
        models, _ = pipeline.select(locate.resolve([], fine_tunes, "main", False), explicit=False)
        got = {m.snapshot.repo_id: pipeline.judged(m, options, env, remembered) for m in models}
    assert (remembered.judgements, remembered.served) == (2, 2)
    direct = {m.snapshot.repo_id: pipeline.judged(m, options, env) for m in models}
    assert got == direct  # the same findings, decision and facts as each judged on its own


MEMO_SCENARIOS = [
    ("check",), ("check", "--all-revisions"), ("check", "--gpu", "T4", "--task", "dpo"),
    ("check", "--with", "transformers==5.5.1"), ("check", "--weights"), ("list",), ("list", "--all-revisions"),
]


@pytest.mark.parametrize("args", MEMO_SCENARIOS, ids=" ".join)
@pytest.mark.parametrize("where", ["examples", "fine_tunes"])
def test_memoised_scan_is_the_scan_without_the_memo(cli, request, monkeypatch, args, where):
    cache = request.getfixturevalue(where)
    # --weights on the examples: 33 GB of shards, all holes but their headers; the scan does not read holes
    # (readers/weights.py), so each of the four runs scans them for real.
    extra = ("--fail-on", "never") if args[0] == "check" else ()
    for fmt in ("json", "text"):
        got = cli(*args, "--cache-dir", cache, "--format", fmt, *extra)
        with monkeypatch.context() as m:
            m.setenv("GEMMA_DOCTOR_NO_MEMO", "1")
            want = cli(*args, "--cache-dir", cache, "--format", fmt, *extra)
        assert (got.code, got.out, got.err) == (want.code, want.out, want.err)
        if fmt == "json" and where == "examples" and "--weights" in args:
            # Both example models' weights were really scanned, every byte of their shards.
            scanned = [m["weights_scan"]["total"]["bytes"] for m in got.json()["models"] if "weights_scan" in m]
            assert len(scanned) == 2 and sum(scanned) > 30 * 10**9, scanned


def test_neutral_names_written_in_the_training_config_are_the_users_own(cli, fine_tunes, monkeypatch, tmp_path):
    """A neutral name that the environment holds (a training config value, quoted in the plan and the prescription) is
    the user's own text: a judgement holding it is not shared, and the scan says what the scan without the memo says."""
    from gemma_doctor import memo

    tc = tmp_path / "train.yaml"
    tc.write_text(f"optim: {memo.COMMIT}\nlr_scheduler_type: {memo.NAME}\n")
    args = ("check", "--cache-dir", fine_tunes, "--format", "json", "--fail-on", "never", "--training-config", tc)
    got = cli(*args)
    monkeypatch.setenv("GEMMA_DOCTOR_NO_MEMO", "1")
    want = cli(*args)
    assert memo.COMMIT in want.out
    assert (got.code, got.out) == (want.code, want.out)


@pytest.fixture
def text_keyed(tmp_path):
    """Fine-tunes whose config texts test the memo's key: equal texts, one value apart, the repo's own id written as a
    value (plain and escaped), a link-like value, an escape."""
    from tests.builders import HubCache, gemma3_1b_config, variant

    hub = HubCache(tmp_path / "hub")
    cfg = gemma3_1b_config()
    configs = {
        "a/plain-1": variant(cfg), "b/plain-2": variant(cfg), "c/plain-3": variant(cfg, rope_theta=20000.0),
        "d/names-itself": variant(cfg, finetuned_from="d/names-itself"),
        "e/names-itself": variant(cfg, finetuned_from="e/names-itself"),
        "f/blobs": variant(cfg, note="../../blobs/" + "a" * 40),
        "g/escaped": variant(cfg, note="caf\u00e9"),
        "h/escaped": variant(cfg, note="caf\u00e9"),
        "j/own-name": variant(cfg, _name_or_path="j/own-name"),
        "k/folder-name": variant(cfg, _name_or_path="/home/me/runs/k"),
    }
    for repo, config in configs.items():
        hub.add(repo, {"config.json": config})
    # The repo's id written with JSON's escaped slash: the same data as names-itself, another text.
    raw = json_text(variant(cfg, finetuned_from="i/escaped-slash")).replace(b"i/escaped-slash", b"i\\/escaped-slash")
    hub.add("i/escaped-slash", {"config.json": raw})
    return hub.root


def json_text(config) -> bytes:
    from tests.builders import dumps

    return dumps(config)


def test_a_name_in_the_models_files_is_a_fact(text_keyed):
    """Keys are equal exactly where the name-free facts are: the repo's own id written as another value of its
    config (finetuned_from) is a fact of its files, so two repos naming themselves there do not share; the config's
    own _name_or_path is a name, so a repo naming itself there shares with one naming the folder it was saved from."""
    keys = {repo: k for (repo, _), k in _keys(text_keyed).items()}
    assert keys["a/plain-1"] == keys["b/plain-2"] != keys["c/plain-3"]
    assert keys["j/own-name"] == keys["k/folder-name"] != keys["a/plain-1"]
    assert keys["g/escaped"] == keys["h/escaped"] != keys["a/plain-1"]
    assert len({keys[r] for r in ("d/names-itself", "e/names-itself", "i/escaped-slash", "f/blobs", "a/plain-1")}) == 5


def test_a_judgement_that_reads_the_models_files_is_not_shared(fine_tunes):
    """A judgement that reads a file through the model's source (as a rule opening a file during the judgement would)
    is not a function of the facts read before: the neutral source refuses the read, and every model is judged on its
    own facts, its own folder answering."""
    from gemma_doctor import locate, memo, pipeline
    from gemma_doctor.facts import CheckOptions
    from gemma_doctor.readers import parsed

    options = CheckOptions()
    remembered = memo.Memo(pipeline.environment(options), options)

    def judge(facts):
        return facts, (facts.source.has("model.safetensors"), facts.snapshot.repo_id)

    with parsed.sharing():
        models, _ = pipeline.select(locate.resolve([], fine_tunes, "main", False), explicit=False)
        got = [remembered.judged(pipeline.read_more(m, options), judge)[1] for m in models if m.family.is_gemma]
    assert got == [(True, m.snapshot.repo_id) for m in models if m.family.is_gemma]
    assert (remembered.judgements, remembered.served) == (0, 0)
    assert remembered.entries and all(v is memo._DIRECT for v in remembered.entries.values())  # tried, refused


def test_a_place_for_a_name_in_the_models_files_is_judged_directly(tmp_path):
    """A config value written like the place the engine fills with a model's name would be filled in (with another
    model's name, once shared): such a model makes no key, and is judged as it is."""
    from gemma_doctor import locate, memo, pipeline
    from gemma_doctor.facts import CheckOptions
    from gemma_doctor.report import MODEL_ID
    from tests.builders import HubCache, gemma3_1b_config, variant

    hub = HubCache(tmp_path / "hub")
    hub.add("a/marked", {"config.json": variant(gemma3_1b_config(), note=f"trained from {MODEL_ID}")})
    models, _ = pipeline.select(locate.resolve([], hub.root, "main", False), explicit=False)
    f = pipeline.read_more(models[0], CheckOptions())
    with pytest.raises(memo.Unmemoisable):
        memo.key_of(memo.name_free(f)[1], f)


def test_a_name_in_the_models_files_keeps_its_judgement_apart(cli, text_keyed, monkeypatch):
    """Two repos whose configs name each repo itself: each judged on its own, and the scan is the scan without the
    memo."""
    judged = _decisions(monkeypatch)
    got = cli("check", "--cache-dir", text_keyed, "--format", "json", "--fail-on", "never")
    assert {"d/names-itself", "e/names-itself"} <= set(judged)  # each judged as itself, neither served the other
    monkeypatch.setenv("GEMMA_DOCTOR_NO_MEMO", "1")
    want = cli("check", "--cache-dir", text_keyed, "--format", "json", "--fail-on", "never")
    assert (got.code, got.out) == (want.code, want.out)


def test_a_header_parsed_once_is_the_header_parsed_again(tmp_path):
    """safetensors_header._parsed (the same header bytes parsed once per process) gives what parse_header gives, for
    the same bytes under another path, other bytes, and a bad header; the metadata is each caller's own dict."""
    from pathlib import Path

    from gemma_doctor.readers import parsed
    from gemma_doctor.readers import safetensors_header as sh

    good, other = _weights("BF16"), _weights("F32")
    n = int.from_bytes(good[:8], "little")
    with parsed.sharing():
        for data in (good, other, good, good[:8] + b"{" + good[9:], good[:-2]):
            m = int.from_bytes(data[:8], "little")
            for path in (Path("/a/model.safetensors"), Path("/b/model.safetensors")):
                got, want = sh._parsed(data[8:8 + m], len(data), path), sh.parse_header(data[8:8 + m], len(data), path)
                assert got == want and got.path == path
        one = sh._parsed(good[8:8 + n], len(good), Path("/c"))
        two = sh._parsed(good[8:8 + n], len(good), Path("/d"))
        assert one.tensors is two.tensors and one.metadata == two.metadata and one.metadata is not two.metadata
    # outside a scan nothing is shared
    assert sh._parsed(good[8:8 + n], len(good), Path("/c")).tensors is not one.tensors


def test_a_config_text_is_parsed_once_in_a_scan_and_never_shared_outside_one(tmp_path):
    from gemma_doctor.readers import jsonfile, parsed

    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text('{"model_type": "gemma3", "x": [1, 2.5]}')
    (tmp_path / "c.json").write_text('{"model_type": "gemma3", "x": [1, 2.5], "x": 3}')
    read = lambda name: jsonfile.read_json_file(tmp_path / name)  # noqa: E731
    with parsed.sharing():
        a, b, c = read("a.json"), read("b.json"), read("c.json")
        assert a.data is b.data and a.data == {"model_type": "gemma3", "x": [1, 2.5]}
        assert c.error and c.data is None  # a duplicate key, refused the same way
    a2, b2 = read("a.json"), read("b.json")
    assert a2.data == b2.data == a.data and a2.data is not b2.data and a2.data is not a.data
    assert (a.path, a.raw, a.error) == (a2.path, a2.raw, a2.error)


def test_a_header_is_keyed_by_the_digest_of_its_bytes(tmp_path):
    """In a scan, a header read carries the digest of its bytes: equal for equal bytes, another for one dtype apart;
    outside a scan none is taken (no judgement is shared there, and check's start-up imports no hashlib for it)."""
    from gemma_doctor.readers import parsed
    from gemma_doctor.readers.safetensors_header import read_header

    for name, dtype in (("a", "BF16"), ("b", "BF16"), ("c", "F32")):
        (tmp_path / f"{name}.safetensors").write_bytes(_weights(dtype))
    with parsed.sharing():
        a, b, c = (read_header(tmp_path / f"{n}.safetensors") for n in "abc")
    assert a.digest is not None and a.digest == b.digest != c.digest
    assert a.tensors == b.tensors != c.tensors
    assert read_header(tmp_path / "a.safetensors").digest is None


def test_judging_the_candidates_needs_no_yaml(hub):
    """The search judges each candidate run directly (search.as_read), so a check with no YAML of the user's to read
    imports no PyYAML at all (on the tree before, every candidate's YAML was printed and parsed back: ~10% of a
    one-repo check's start-up), whether the prescription passes or is refused."""
    import json
    import os
    import subprocess
    import sys

    from tests.builders import gemma3_12b_config, generation_config

    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    probe = ("import json, sys\nfrom gemma_doctor.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
             "    pass\nprint(json.dumps(sorted(sys.modules)), file=sys.stderr)\n")
    env = {k: v for k, v in os.environ.items() if k != "GEMMA_DOCTOR_PROGRESS"}
    for extra in ((), ("--gpu", "T4"), ("--with", "transformers==5.5.1")):
        res = subprocess.run([sys.executable, "-c", probe, "check", "google/gemma-3-12b-it", "--cache-dir",
                              str(hub.root), "--format", "json", *extra], capture_output=True, text=True, timeout=120)
        mods = set(json.loads(res.stderr.strip().splitlines()[-1]))
        assert "gemma_doctor.plan.search" in mods and "yaml" not in mods, extra
