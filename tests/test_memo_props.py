"""The scan's shared judgements change no output, as a property over random caches (issue 32's Tests: "output
byte-equal with the judgement cache off").

A whole-cache `check` shares one judgement across the repos whose name-free facts are equal (memo.Memo, made by the
scan). A random cache here is two to six repos under their own names, drawn from a few Gemma configs (each as published
or changed in one key) beside a generation config (absent, as on the Hub, or one that turns the KV cache off) and a
tokenizer config or none, with repeats, so that several repos hold the same config.json (the memo's gate) and some of
them equal facts (its key); checked under a random GPU, task and transformers. The text and JSON views of that scan
with sharing on and off (``pipeline.diagnose(share=False)``: every model judged directly) are byte-equal.

Everything runs in this process; Hypothesis in the derandomised CI profile (tests/conftest.py). A key that leaves out
the model's facts but its config text (every repo of one config.json served one judgement) fails this property at
its first examples."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemma_doctor import pipeline
from gemma_doctor.facts import CheckOptions
from gemma_doctor.render.formats import CHECK, Checked, renderer
from gemma_doctor.report import FailOn
from tests.builders import (HubCache, gemma2_config, gemma3_1b_config, gemma3_12b_config, gemma3n_config,
                            generation_config, variant)
from tests.test_pitfalls import tokenizer_config

CONFIGS = {"gemma3-1b": gemma3_1b_config, "gemma2": gemma2_config, "gemma3-12b": gemma3_12b_config,
           "gemma3n": gemma3n_config}
# One key changed, or none: what tells fine-tunes of one base apart in config.json.
CHANGES = {"as published": {}, "use_cache false": {"use_cache": False}, "float32": {"torch_dtype": "float32"},
           "vocab 256000": {"vocab_size": 256000}}
GENERATION = {"none": None, "as on the Hub": generation_config, "use_cache false":
              lambda: {**generation_config(), "use_cache": False}}

repo_spec = st.tuples(st.sampled_from(sorted(CONFIGS)), st.sampled_from(sorted(CHANGES)),
                      st.sampled_from(sorted(GENERATION)), st.booleans())
caches = st.lists(repo_spec, min_size=1, max_size=3).flatmap(
    lambda specs: st.lists(st.sampled_from(specs), min_size=2, max_size=6))  # repeats: equal facts, other names
options = st.builds(
    lambda gpu, task, stack: CheckOptions(fail_on=FailOn.NEVER, gpu=gpu, task=task, with_packages=stack),
    st.sampled_from((None, "none", "T4", "A100", "L4")), st.sampled_from((None, "dpo")),
    st.sampled_from(((), ("transformers==4.50.3",), ("transformers==5.5.1",))))


def _files(spec: tuple[str, str, str, bool]) -> dict:
    model, change, generation, tokenizer = spec
    files: dict = {"config.json": variant(CONFIGS[model](), **CHANGES[change])}
    if GENERATION[generation] is not None:
        files["generation_config.json"] = GENERATION[generation]()
    if tokenizer:
        files["tokenizer_config.json"] = tokenizer_config()
    return files


def _views(cache: Path, opts: CheckOptions, share: bool) -> tuple[str, ...]:
    """The text and JSON of `check` on the whole cache, as the CLI prints them (cli/check.py, no colour)."""
    out = []
    for fmt in ("text", "json"):
        view = renderer(CHECK, fmt)
        report = pipeline.diagnose([], cache, options=opts, finish=view.streaming(False), share=share)
        out.append(view.render(Checked(report, opts.fail_on), False))
    return tuple(out)


@settings(max_examples=20, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(specs=caches, opts=options)
def test_a_scan_says_the_same_bytes_with_its_shared_judgements_off(specs, opts):
    with tempfile.TemporaryDirectory() as tmp:
        hub = HubCache(Path(tmp) / "hub")
        for n, spec in enumerate(specs):
            hub.add(f"org{n % 2}/model-{n}", _files(spec))
        shared, direct = _views(hub.root, opts, True), _views(hub.root, opts, False)
    assert shared[0] == direct[0]
    assert shared[1] == direct[1]
