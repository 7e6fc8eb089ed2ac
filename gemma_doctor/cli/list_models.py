"""`gemma-doctor list`: the cached Gemma-family models, one row each, like `hf cache ls`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from gemma_doctor.cli import common
from gemma_doctor.render.formats import LIST, Rows, renderer
from gemma_doctor.report import ExitCode


@click.command("list", context_settings=common.CONTEXT)
@common.cache_options()
@click.option("--filter", "filters", multiple=True, metavar="EXPR",
              help="Keep rows matching EXPR, like hf cache ls: size>1GB, family=gemma3, status=needs-fix, "
                   "dtype=bfloat16, name=google/*. Repeatable (all must hold).")
@click.option("--sort", default=None, help="name, size, family or status, optionally :asc or :desc (size defaults to desc).")
@click.option("--limit", type=click.IntRange(min=0), default=None, help="Show only the first N rows after sorting.")
@common.format_option(LIST)
@click.option("--quiet", "-q", is_flag=True, help="One repo id per line (same as --format quiet).")
@common.stack_options
def list_models(cache_dir: Optional[Path], revision: str, all_revisions: bool, filters: tuple[str, ...], sort: Optional[str],
                limit: Optional[int], fmt: str, quiet: bool, with_packages: tuple[str, ...], requirements: Optional[str]) -> int:
    """List cached Gemma-family models: family, revision, size, declared dtype, status (ok, needs-fix, fixed, broken, error)."""
    from gemma_doctor import listing
    from gemma_doctor.facts import CheckOptions
    from gemma_doctor.locate import default_cache_dir

    view = renderer(LIST, "quiet" if quiet else fmt)  # --quiet is --format quiet

    cache = cache_dir if cache_dir is not None else default_cache_dir()
    rows, skipped = listing.collect(cache, revision, all_revisions,
                                    CheckOptions(with_packages=tuple(with_packages), requirements=requirements))
    shown = listing.select_rows(rows, list(filters), sort, limit)
    common.out(view.render(Rows(shown, skipped), common.color()))
    if not rows:
        common.hint(f"no Gemma-family model in {cache}; download one with: hf download google/gemma-3-1b-it")
    pending = [r for r in shown if r.status is listing.RowStatus.NEEDS_FIX]
    if pending and view.for_people:
        common.hint(f"{len(pending)} model(s) need a fix; see why with: {pending[0].check_command}, "
                    f"then: {pending[0].next_command}")
    broken = [r for r in shown if r.status is listing.RowStatus.BROKEN]
    if broken and view.for_people:
        common.hint(f"{len(broken)} model(s) have missing or corrupt files that no fix repairs; download them again: "
                    f"{broken[0].next_command}")
    return ExitCode.OK
