"""`gemma-doctor restore`: undo `fix --inplace` from the undo record."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from gemma_doctor.cli import common
from gemma_doctor.render.formats import RESTORE, Outcomes, renderer
from gemma_doctor.report import ExitCode


@click.command(context_settings=common.CONTEXT)
@common.targets
@click.option("--dry-run", is_flag=True, help="Say what would be restored, change nothing.")
@click.option("--force", is_flag=True, help="Also restore files edited since the fix; your edited version is kept in "
                                            ".gemma-doctor/kept/ (the message says where).")
@common.cache_options()
@common.format_option(RESTORE)
@common.lock_option
def restore(targets: tuple[str, ...], dry_run: bool, force: bool, cache_dir: Optional[Path], revision: str,
            all_revisions: bool, fmt: str, lock_timeout: float) -> int:
    """Undo `fix --inplace`: snapshot files become the original links (or bytes), byte-identical."""
    from gemma_doctor.fixes import Outcome, restore_model

    outcomes: list[Outcome] = []
    failed = conflicted = False
    for facts in common.models(list(targets), cache_dir, revision, all_revisions):
        outcome, conflict, fail = restore_model(facts, dry_run, force, lock_timeout)
        conflicted |= conflict
        failed |= fail
        outcomes.append(outcome)
    common.out(renderer(RESTORE, fmt).render(Outcomes(RESTORE, outcomes, dry_run, not (failed or conflicted)),
                                             common.color()))
    return ExitCode.WRITE_FAILED if failed else ExitCode.FINDINGS if conflicted else ExitCode.OK
