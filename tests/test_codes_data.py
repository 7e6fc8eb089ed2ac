"""What a finding is lives on its code's entry and on the rule that emits it (issue 32, item 4): which rules a version pin
can answer, which rules run last, fixable by `fix`, needs a re-download, concerns memory, sits in a training config are
read from codes.py's entries and the rules' declarations (codes.emits), never from literals in the views, the CLI or the
search."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from gemma_doctor import rules
from gemma_doctor.codes import CODES, codes_of
from tests.builders import build_example_cache

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gemma_doctor"
# The modules that decide what a finding is when they show or weigh it (a folder: each of its modules): list's status,
# every view (github's annotation sites among them), the CLI, the search.
DECIDERS = ("listing.py", "render", "cli", "plan/search.py")
CODE = re.compile(r"^GD\d{3}$")
CODE_OR_RANGE = re.compile(r"^GD\d{0,3}x*$")  # "GD601", and "GD6" / "GD6xx" as a range's prefix
RULE_NAMES = {f"{r.__module__.rsplit('.', 1)[-1]}.{r.__name__}" for r in rules.RULES}  # "crashes.check"
RULE_MODULES = {r.__module__.rsplit(".", 1)[-1] for r in rules.RULES}  # "crashes"


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _reads(node: ast.AST, *attrs: str) -> bool:
    """Whether ``node`` reads some object's attribute named one of ``attrs`` (a finding's ``key``, ``message``...)."""
    return any(isinstance(n, ast.Attribute) and n.attr in attrs for n in ast.walk(node))


# A finding's text: what it says, never what it is.
WORDING = ("message", "fix")
# String methods that decide by (or cut) a text's wording.
TEXT_TESTS = ("startswith", "endswith", "removeprefix", "removesuffix", "split", "partition", "rpartition", "find",
              "index")


def literal_decisions(source: str) -> list[tuple[int, str]]:
    """(line, what) for each place ``source`` decides by a literal code, code range or rule name: a collection literal
    holding one, a comparison with one, a ``startswith`` of one, a literal code as an index (``CODES["GD739"]``,
    ``.get("GD739")``), a code's characters (``f.code[2]``, ``int(f.code[2:])``: a range by its number), a rule's
    module or function name compared with a string; or by a finding's key (a ``startswith`` / ``endswith`` of a key, a
    key compared with a string: what a finding is about is its code's entry, Code.accumulation, not a key's suffix);
    or by its wording (a string test of its message or fix)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "startswith", "endswith") and _reads(node.func.value, "key"):
            found.append((node.lineno, f"{node.func.attr} of a finding's key"))
        if isinstance(node, ast.Compare) and any(_reads(c, "key") for c in (node.left, *node.comparators)) and any(
                isinstance(c, ast.Constant) and isinstance(c.value, str) for c in (node.left, *node.comparators)):
            found.append((node.lineno, "a finding's key compared with a string"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in TEXT_TESTS \
                and _reads(node.func.value, *WORDING):
            found.append((node.lineno, f"{node.func.attr} of a finding's wording"))
        if isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn, ast.Eq, ast.NotEq)) for o in node.ops) \
                and any(_reads(c, *WORDING) for c in (node.left, *node.comparators)) \
                and any(isinstance(c, ast.Constant) and isinstance(c.value, str) for c in (node.left, *node.comparators)):
            found.append((node.lineno, "a finding's wording compared with a string"))
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "code":
            found.append((node.lineno, "a code's characters"))
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(
                node.slice.value, str) and CODE.match(node.slice.value):
            found.append((node.lineno, f"indexed by {node.slice.value!r}"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and any(
                isinstance(a, ast.Constant) and isinstance(a.value, str) and CODE.match(a.value) for a in node.args):
            found.append((node.lineno, "get of a literal code"))
        if isinstance(node, (ast.Compare, ast.Call)) and _reads(node, "__module__", "__name__", "__qualname__") and any(
                isinstance(s, str) and (s in RULE_NAMES or s.split(".")[-1] in RULE_MODULES) for s in _strings(node)):
            found.append((node.lineno, "a rule's name compared with a string"))
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            elements = node.keys if isinstance(node, ast.Dict) else node.elts
            for e in elements:
                if isinstance(e, ast.Constant) and isinstance(e.value, str) and (
                        CODE.match(e.value) or e.value in RULE_NAMES):
                    found.append((node.lineno, f"a literal collection holding {e.value!r}"))
        elif isinstance(node, ast.Compare):
            for s in _strings(ast.Module(body=[ast.Expr(c) for c in node.comparators] + [ast.Expr(node.left)],
                                         type_ignores=[])):
                if CODE_OR_RANGE.match(s) or s in RULE_NAMES:
                    found.append((node.lineno, f"a comparison with {s!r}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "startswith", "endswith"):
            for s in _strings(ast.Module(body=[ast.Expr(a) for a in node.args], type_ignores=[])):
                if CODE_OR_RANGE.match(s):
                    found.append((node.lineno, f"{node.func.attr}({s!r})"))
    return found


@pytest.mark.parametrize("module", DECIDERS)
def test_no_view_cli_or_search_decides_by_a_literal_code_or_rule_name(module):
    path = PACKAGE / module
    files = sorted(path.glob("*.py")) if path.is_dir() else [path]
    assert files, module
    found = [(f"{f.relative_to(PACKAGE)}:{line}", what) for f in files for line, what in literal_decisions(f.read_text())]
    assert not found, f"{module}: {found} (declare it on the code's entry in codes.py or with codes.emits on the rule)"


@pytest.mark.parametrize("source, flagged", [
    ('_PINNING_RULES = ("crashes.check",)\n', True),  # what plan/search.py held
    ('_COSTLY_LAST = ("catalogue.check", "libraries.beyond_horizon")\n', True),
    ('if f.code in ("GD203", "GD204"):\n    pass\n', True),
    ('if f.code.startswith("GD6"):\n    pass\n', True),
    ('if "GD600" <= f.code < "GD700":\n    pass\n', True),
    # What plan/search.py held: a finding was about the run's accumulation when its key ended so (Code.accumulation now).
    ('_ACCUMULATION = "gradient_accumulation_steps"\n'
     'def _on_accumulation(findings):\n    return any((f.key or "").endswith(_ACCUMULATION) for f in findings)\n', True),
    ('if f.key == "gradient_accumulation_steps":\n    pass\n', True),
    ('if "per_device_train_batch_size" in (f.key or ""):\n    pass\n', True),
    ('x = Finding("GD601", Severity.ERROR, "...")\n', False),  # emitting a finding decides nothing about it
    ('x = Finding("GD739", Severity.WARNING, "...", key=setting.key)\n', False),  # pointing at a key decides nothing
    # A range by the code's number, a literal code as an index, a rule by its module's name.
    ('if f.code[2] == "6":\n    pass\n', True),
    ('if 600 <= int(f.code[2:]) < 700:\n    pass\n', True),
    ('if CODES["GD739"].site is Site.RUN:\n    pass\n', True),
    ('code = CODES.get("GD003")\n', True),
    ('pinning = [r for r in rules.RULES if r.__module__.endswith("crashes")]\n', True),
    ('if rule.__name__ == "check" and rule.__module__ == "gemma_doctor.rules.crashes":\n    pass\n', True),
    ('code = CODES.get(f.code)\n', False),  # the finding's own code's entry: what it is, as data
    # By its wording: what cli.py's check said of a model that is not a Gemma (GD003's own text, cut).
    ('said = f"{m.target}: {f.message.removesuffix(\'; left alone\')}"\n', True),
    ('if "not a Gemma" in f.message:\n    pass\n', True),
    ('line = f"{f.code}: {f.fix or f.message}"\n', False),  # shown as it is
    ('"""GD640 without a training config names config.json."""\n', False),
])
def test_the_literal_finder_finds_what_it_is_for(source, flagged):
    assert bool(literal_decisions(source)) is flagged


def test_every_rule_declares_the_codes_it_emits():
    """Each rule's declaration (codes.emits) names known codes, and covers every code its module writes (after.py's
    rule emits serving.py's); every code a pin resolves is some rule's, so the search asks that rule for pins."""
    declared: dict[str, frozenset[str]] = {}
    for rule in rules.RULES:
        codes = codes_of(rule)
        assert codes, f"{rule.__module__}.{rule.__name__} declares no codes (codes.emits)"
        assert codes <= set(CODES), sorted(codes - set(CODES))
        module = rule.__module__.rsplit(".", 1)[-1]
        declared[module] = declared.get(module, frozenset()) | codes
    declared["serving"] = declared["after"]
    for path in sorted((PACKAGE / "rules").glob("*.py")):
        if path.stem in ("__init__", "common"):
            continue
        written = {s for s in _strings(ast.parse(path.read_text())) if CODE.match(s)}
        assert written <= declared[path.stem], f"{path.name} writes {sorted(written - declared[path.stem])}, undeclared"
    pins = {c.code for c in CODES.values() if c.pins}
    assert pins and pins <= frozenset().union(*declared.values())


ACCUMULATES = "<a run that accumulates>"
ACCUMULATES_YAML = "per_device_train_batch_size: 2\ngradient_accumulation_steps: 4\nbf16: true\n"


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("codes") / "hub"
    build_example_cache(cache)
    return cache


@pytest.mark.parametrize("options", [
    {"gpu": "T4", "with_packages": ("transformers==4.50.3",)},
    {"gpu": "A100", "training_config": str(ROOT / "examples" / "gemma-4-E2B-it.train.yaml")},
    {"gpu": "none", "with_packages": ("transformers==5.5.0", "trasformers==5.5.0")},
    # A run that accumulates where Gemma 3's multimodal loss is scaled by the steps (GD739).
    {"gpu": "A100", "with_packages": ("transformers==4.51.0",), "training_config": ACCUMULATES},
])
def test_every_finding_a_rule_gives_has_a_code_it_declared(examples, options, tmp_path):
    """The declarations as the rules run: on the example cache's models, each rule's findings are of its own codes,
    and a finding at the run's accumulation setting is of a code whose entry says it is about accumulation (what the
    search reads, Code.accumulation; the entries' side is generated from the catalogue's conditions)."""
    from gemma_doctor import locate, pipeline
    from gemma_doctor.facts import CheckOptions

    if options.get("training_config") == ACCUMULATES:
        (tmp_path / "run.yaml").write_text(ACCUMULATES_YAML)
        options = {**options, "training_config": str(tmp_path / "run.yaml")}
    opts = CheckOptions(**options)
    env = pipeline.environment(opts)
    models, _ = pipeline.select(locate.resolve([], examples, "main", False), explicit=False)
    seen, accumulation_seen = 0, False
    for m in models:
        facts = pipeline.decide(pipeline.read_more(m, opts), opts, env).facts
        for rule in rules.RULES:
            for f in rule(facts, env, opts):
                seen += 1
                assert f.code in codes_of(rule), (f"{rule.__module__}.{rule.__name__}", f.code)
                at_accumulation = (f.key or "").split(".")[-1] == "gradient_accumulation_steps"
                assert at_accumulation <= CODES[f.code].accumulation, (f.code, f.key)
                accumulation_seen |= CODES[f.code].accumulation
    assert seen
    assert accumulation_seen is (options.get("with_packages") == ("transformers==4.51.0",))


@pytest.mark.parametrize("code, pinned", [("GD105", True), ("GD110", False), ("GD620", False)])
def test_a_pin_answers_only_the_codes_whose_entry_says_so(code, pinned):
    """The search pins transformers past a finding's window only where the finding's code is one a pin resolves
    (Code.pins), whatever its details carry: a finding of another code with an unknown exposure and a window is left to
    the way out."""
    from gemma_doctor.facts import Environment
    from gemma_doctor.plan import search
    from gemma_doctor.readers.versions import Versions
    from gemma_doctor.report import Finding, Severity
    from gemma_doctor.stack import Stack

    env = Environment(Versions(), stack=Stack({}, planned=True))  # no transformers named: the prescription's to pin
    f = Finding(code, Severity.WARNING, "...", details={"exposure": "unknown", "window": ">=5.0.0,<5.6.0"})
    got = search._pin(env, (f,))
    assert (got is not None) is pinned
    if pinned:
        assert got[1] == ("transformers>=5.6.0", code)
