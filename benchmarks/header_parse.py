"""Benchmark the safetensors header parser (`parse_header`) against another revision's, in-process, same run.

Headers timed: a tiny Gemma 3 checkpoint saved by transformers (the shape of half the repos in benchmarks/startup.py's
caches) and the shard headers of the bundled google/gemma-3-12b-it and google/gemma-4-E2B-it snapshots
(examples/build_example_cache.py: real tensor names and shapes, 136-1,195 tensors). For each header, rounds of
    baseline  the baseline revision's parse_header (its module loaded from `git show REV:...`);
    parse     this tree's parse_header (the fast path where it applies);
    strict    this tree's _parse_strict (the fallback for headers the fast path leaves to it);
    loads     a plain json.loads of the header text (the floor of any parse that uses the json module)
are interleaved, each the best of --repeat timings of --number calls, in microseconds per header. Every header's
three results are checked equal first (and the fast path taken).
With --cache N --baseline-tree TREE (a git worktree of the baseline revision), also a whole-cache `check` (no target)
of this tree against TREE, alternated (benchmarks/startup.py's timing): N repos x 2 revisions, half of them the tiny
Gemma 3 checkpoint saved by transformers (config, generation config, model.safetensors), half a Llama config.
Run: .venv/bin/python benchmarks/header_parse.py [--baseline 197d734] [--rounds 5] [--cache 1000 --baseline-tree T]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gemma_doctor.readers import safetensors_header as current  # noqa: E402

MODULE = "gemma_doctor/readers/safetensors_header.py"
TINY_GEMMA3 = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=16)


def baseline_module(rev: str):  # noqa: ANN201
    """The parser module as it was at ``rev``, loaded under another name."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{MODULE}"], check=True, capture_output=True,
                            text=True).stdout
    spec = importlib.util.spec_from_loader("baseline_safetensors_header", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(source, f"{rev}:{MODULE}", "exec"), module.__dict__)  # noqa: S102 - our own file at another commit
    return module


def header_of(path: Path) -> tuple[bytes, int]:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return f.read(n), os.path.getsize(path)


def headers(tmp: Path) -> dict[str, tuple[bytes, int]]:
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    model = Gemma3ForCausalLM(Gemma3TextConfig(**TINY_GEMMA3)).to(torch.bfloat16)
    model.generation_config.do_sample = False  # a plain generation_config.json
    model.save_pretrained(tmp / "tiny")
    out = {"tiny Gemma 3 (transformers)": header_of(tmp / "tiny" / "model.safetensors")}
    subprocess.run([sys.executable, str(ROOT / "examples" / "build_example_cache.py"), str(tmp / "cache")], check=True,
                   capture_output=True)
    for path in sorted((tmp / "cache").glob("models--*/snapshots/*/*.safetensors")):
        repo = path.parts[-4].removeprefix("models--").split("--", 1)[1]
        out[f"{repo} {path.name.removesuffix('.safetensors')}"] = header_of(path)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="197d734", help="git revision to compare with (default: the tree before the "
                                                          "fast path)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cache", type=int, metavar="N", help="also time a whole-cache check of N repos x 2 revisions")
    ap.add_argument("--baseline-tree", metavar="TREE", help="checkout of the baseline revision, for --cache")
    ap.add_argument("--runs", type=int, default=5, help="whole-cache checks per tree, for --cache")
    args = ap.parse_args()
    base = baseline_module(args.baseline)
    here = Path("x.safetensors")
    with tempfile.TemporaryDirectory() as tmp:
        cases = headers(Path(tmp))
        if args.cache:
            whole_cache(Path(tmp), args.cache, Path(args.baseline_tree), args.runs)
    print(f"| header | bytes | tensors | {args.baseline} | parse | strict | json.loads | parse / {args.baseline} |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, (raw, size) in cases.items():
        old = base.parse_header(raw, size, here)
        new = current.parse_header(raw, size, here)
        assert old.ok and new == current._parse_strict(raw, size, here), name
        assert (new.tensors, new.metadata, new.error) == (tuple(current.TensorInfo(*vars_of(t)) for t in old.tensors),
                                                          old.metadata, old.error), name
        assert current._parse_fast(raw, size, here) is not None, f"{name}: the fast path was not taken"
        text = raw.decode()
        calls = {"baseline": lambda: base.parse_header(raw, size, here),
                 "parse": lambda: current.parse_header(raw, size, here),
                 "strict": lambda: current._parse_strict(raw, size, here),
                 "loads": lambda: json.loads(text)}
        number = max(1, 20_000 // len(old.tensors))
        best = dict.fromkeys(calls, float("inf"))
        for _ in range(args.rounds):
            for key, fn in calls.items():
                best[key] = min(best[key], min(timeit.repeat(fn, number=number, repeat=args.repeat)) / number * 1e6)
        print(f"| {name} | {len(raw):,} | {len(old.tensors):,} | {best['baseline']:.0f} us | {best['parse']:.0f} us | "
              f"{best['strict']:.0f} us | {best['loads']:.0f} us | **{best['parse'] / best['baseline']:.2f}** |")


def whole_cache(tmp: Path, repos: int, baseline_tree: Path, runs: int) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import startup
    from tests.builders import HubCache, llama_config, variant

    tiny = {p.name: p.read_bytes() for p in (tmp / "tiny").iterdir() if p.is_file()}
    config = json.loads(tiny["config.json"])
    hub, other = HubCache(tmp / "hub"), llama_config()
    for i in range(repos):
        repo = f"org{i % 37}/model-{i:05d}"
        for name, refs in ((f"old-{i}", ()), (repo, None)):
            files = ({**tiny, "config.json": variant(config, _name_or_path=name)} if i % 2 == 0
                     else {"config.json": variant(other, _name_or_path=name)})
            hub.add(repo, files, **({"refs": refs} if refs is not None else {}))
    cmds = {tree: ["env", f"PYTHONPATH={path}", sys.executable, "-m", "gemma_doctor", "check", "--cache-dir",
                   str(tmp / "hub"), "--format", "json", "--fail-on", "never"]
            for tree, path in (("this tree", ROOT), ("baseline", baseline_tree.resolve()))}
    outputs = {tree: subprocess.run(cmd, capture_output=True, cwd=startup.NEUTRAL, env=startup.ENV).stdout
               for tree, cmd in cmds.items()}
    assert outputs["this tree"] == outputs["baseline"], "the two trees disagree"
    assert outputs["this tree"].count(b"\"BF16\"") >= repos // 2, "the headers were not read"
    wall = startup.compare(cmds, runs)
    print(f"\nwhole-cache check, {repos} repos x 2 revisions ({repos // 2} tiny Gemma 3 checkpoints), median of {runs}:"
          f" this tree {wall['this tree']:.3f} s, baseline {wall['baseline']:.3f} s "
          f"(CPU {startup.cpu['this tree']:.3f} vs {startup.cpu['baseline']:.3f} s: "
          f"{startup.cpu['this tree'] / startup.cpu['baseline']:.2f})\n")


def vars_of(t: object) -> tuple:
    return (t.name, t.dtype, t.shape, t.begin, t.end)  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
