"""`gemma-doctor fix`: plan the cures of the models' config files, print the diff, write only with --inplace."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from gemma_doctor.cli import common
from gemma_doctor.errors import LockTimeout, WriteError
from gemma_doctor.render.formats import FIX, Outcomes, renderer
from gemma_doctor.report import ExitCode


@click.command(context_settings=common.CONTEXT)
@common.targets
@click.option("--inplace", is_flag=True, help="Apply the changes (default: print the diff only).")
@common.cache_options()
@common.format_option(FIX)
@common.lock_option
@common.stack_options
def fix(targets: tuple[str, ...], inplace: bool, cache_dir: Optional[Path], revision: str, all_revisions: bool, fmt: str,
        lock_timeout: float, with_packages: tuple[str, ...], requirements: Optional[str]) -> int:
    """Set use_cache=false where the text model reads it and the transformers that will run crashes without it, and
    tie_word_embeddings=false where a merged model saves a trained lm_head that a tied config discards (GD750);
    prints the diff, writes only with --inplace."""
    from gemma_doctor import stack as stack_mod
    from gemma_doctor.fixes import Outcome, Status, apply_plan, needs_tidy, plan_model, weigh_head
    from gemma_doctor.locate import command_args
    from gemma_doctor.readers.versions import installed

    stack = stack_mod.resolve(installed(), with_packages, requirements)
    outcomes: list[Outcome] = []
    failed = refused = False
    for facts in common.models(list(targets), cache_dir, revision, all_revisions):
        facts = weigh_head(facts)  # GD750's cure needs the head compared with the embedding first
        plan = plan_model(facts, stack)
        outcome = Outcome(facts, plan.status, list(plan.changes), plan.messages)
        refused |= bool(plan.refused)
        # needs_tidy: temp files a killed run left behind are removed (under the lock) even with nothing to change.
        if inplace and (plan.changes or needs_tidy(facts.snapshot)):
            try:
                # Re-planned under the lock when a concurrent run got there first: report what was written.
                written = apply_plan(plan, lock_timeout)
                if plan.changes:
                    outcome.changes = written
                    outcome.status = Status.CHANGED if written else Status.UP_TO_DATE
                if written:
                    outcome.messages.append(f"undo with: gemma-doctor restore {command_args(facts.snapshot)}")
            except WriteError as e:
                outcome.status = Status.FAILED
                if isinstance(e, LockTimeout):
                    outcome.changes = []  # nothing was written: a diff here would read as if it had been
                outcome.messages.append(str(e))
                failed = True
        outcomes.append(outcome)
    common.out(renderer(FIX, fmt).render(Outcomes(FIX, outcomes, not inplace, not (failed or refused)), common.color()))
    pending = sum(len(o.changes) for o in outcomes if o.status is Status.WOULD_CHANGE)
    if not inplace and pending:
        common.hint(f"{pending} file(s) would change; run again with --inplace to apply")
    elif not any(o.changes for o in outcomes) and not refused:
        common.hint("nothing to change")
    return ExitCode.WRITE_FAILED if failed else ExitCode.FINDINGS if refused else ExitCode.OK
