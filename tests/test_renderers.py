"""Every output format of every command is one renderer of render/formats.py's registry, registered under (command,
format), and the CLI picks it from there: no module of the CLI compares format names, and each command's --format
choices are the registry's (outputs themselves: test_check, test_list, test_github_format, test_recommend,
benchmarks/output_ab.py)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import click
import pytest

from gemma_doctor.cli import COMMANDS as CLI_COMMANDS, app
from gemma_doctor.listing import ListFormat
from gemma_doctor.render import OutputFormat
from gemma_doctor.render.formats import COMMANDS, RENDERERS, Renderer, formats, renderer
from gemma_doctor.render.recommend import RecommendFormat

CLI = Path(__file__).resolve().parent.parent / "gemma_doctor" / "cli"
ENUMS = ("OutputFormat", "ListFormat", "RecommendFormat")
NAMES = {name for _, name in RENDERERS} | {f.value for e in (OutputFormat, ListFormat, RecommendFormat) for f in e}


def format_choices(source: str) -> list[str]:
    """Each place ``source`` chooses by a format: an enum member of a format, a comparison with a format's name."""
    wrong = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ENUMS:
            wrong.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
        if isinstance(node, ast.Compare):
            consts = [c.value for c in (node.left, *node.comparators) if isinstance(c, ast.Constant)]
            wrong.extend(f"line {node.lineno}: compares with {c!r}" for c in consts if c in NAMES)
    return wrong


@pytest.mark.parametrize("module", sorted(p.name for p in CLI.glob("*.py")))
def test_no_module_of_the_cli_chooses_its_output_by_format_name(module: str) -> None:
    """No if/elif on a format anywhere in the CLI: the commands look their renderer up."""
    wrong = format_choices((CLI / module).read_text(encoding="utf-8"))
    assert not wrong, f"cli/{module} chooses its output by format name:\n" + "\n".join(wrong)


@pytest.mark.parametrize("source, flagged", [
    # What cli.py's recommend held before its formats were renderers.
    ("if fmt_ is RecommendFormat.JSON:\n    pass\n", True),
    ('out(view.render_json([result]) if fmt == "json" else view.render_text(result))\n', True),
    ('view = renderer(LIST, "quiet" if quiet else fmt)\n', False),  # --quiet names a format; it chooses none
])
def test_the_format_finder_finds_what_it_is_for(source: str, flagged: bool) -> None:
    assert bool(format_choices(source)) is flagged


def test_the_registry_is_the_choices() -> None:
    """The enums the docs list and the registry agree, in order (an exhaustiveness check, as pip-audit's)."""
    assert formats("check") == tuple(f.value for f in OutputFormat)
    assert formats("list") == tuple(f.value for f in ListFormat)
    assert formats("recommend") == tuple(f.value for f in RecommendFormat)
    assert formats("fix") == formats("restore") == formats("rehearse") == ("text", "json")
    assert {cmd for cmd, _ in RENDERERS} == set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_offers_its_registry_formats(command: str) -> None:
    """The --format choices each command's --help shows are its renderers, in the registry's order."""
    ctx = click.Context(app, info_name="gemma-doctor")
    cmd = app.get_command(ctx, command)
    option = next(p for p in cmd.params if p.name == "fmt")
    assert tuple(option.type.choices) == formats(command)


def test_every_command_with_an_output_has_renderers() -> None:
    """Every command of the CLI but completion (a script, in no format) prints through the registry."""
    assert set(CLI_COMMANDS) - {"completion"} == set(COMMANDS)


@pytest.mark.parametrize("key", list(RENDERERS))
def test_each_renderer_has_the_interface(key: tuple[str, str]) -> None:
    r = RENDERERS[key]
    assert (r.command, r.name) == key and isinstance(r.for_people, bool)
    assert r.for_people is (r.name == "text")  # the hints after a table go with the people's format alone
    for method in ("streaming", "render"):
        ours = inspect.signature(getattr(type(r), method))
        theirs = inspect.signature(getattr(Renderer, method))
        assert list(ours.parameters) == list(theirs.parameters), (key, method)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_format_a_command_lacks_is_refused(command: str) -> None:
    for name in sorted(NAMES):
        if name in formats(command):
            assert renderer(command, name.upper()) is RENDERERS[(command, name)]
        else:
            with pytest.raises(ValueError, match="has no"):
                renderer(command, name)


FACTORY = ("model_name_or_path: google/gemma-3-12b-it\nstage: sft\ndo_train: true\nfinetuning_type: lora\n"
           "template: gemma3\ndataset: alpaca_en_demo\noutput_dir: out\nbf16: true\n")


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_rehearse_prints_through_its_renderer(hub, cli, tmp_path, fmt):
    """rehearse's views are the registry's too (the command hands the rehearsal to the --format's renderer): here the
    rehearsal that needs no child, LLaMA-Factory's CLI not installed (GD950)."""
    import json

    from gemma_doctor.rehearse import llamafactory
    from tests.builders import gemma3_12b_config, generation_config

    if llamafactory.command() is not None:
        pytest.skip("LLaMA-Factory is installed here: its rehearsal would train")
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    (tmp_path / "lf.yaml").write_text(FACTORY)
    r = cli("rehearse", "google/gemma-3-12b-it", "--cache-dir", hub.root, "--launch",
            f"llamafactory-cli train {tmp_path / 'lf.yaml'}", "--format", fmt)
    assert r.code == 1
    if fmt == "json":
        doc = json.loads(r.out)
        assert doc["status"] == "failed" and [f["code"] for f in doc["rehearsals"][0]["findings"]] == ["GD950"]
    else:
        assert r.out.startswith("rehearsal of google/gemma-3-12b-it") and "GD950 error" in r.out
        assert r.out.endswith(" s\n") and "rehearsal failed in" in r.out


@pytest.mark.parametrize("fmt, verdict", [("text", "gemma3 (planned): not rehearsed"), ("python", "# gemma3 (planned): "),
                                          ("yaml", "# gemma3 (planned): "), ("json", None)])
def test_recommend_rehearse_verdicts_in_every_view(cli, fmt, verdict):
    """recommend --rehearse's verdicts are drawn by each format's renderer: a line after the text, a comment in Python
    and YAML (they stay pasteable), "rehearsal" per model in JSON (a --family plan: no twin, said without a child)."""
    import json

    r = cli("recommend", "--family", "gemma3", "--size", "12b", "--gpu", "A100", "--rehearse", "--format", fmt)
    assert r.code == 0
    if verdict is None:
        assert json.loads(r.out)["models"][0]["rehearsal"].startswith("not rehearsed: no model folder")
    else:
        assert r.out.splitlines()[-1].startswith(verdict)
    plain = cli("recommend", "--family", "gemma3", "--size", "12b", "--gpu", "A100", "--format", fmt)
    assert "not rehearsed" not in plain.out and ("rehearsal" not in plain.out or fmt != "json")
