"""The decision: what run to prescribe for a model on a GPU with a stack, found by searching against the very rules and
memory plan that `check` runs (docs/decision.md).

- memory.py    the memory model: model shape + run -> bytes per GPU at the peak of a step, and the memory search
- runplan.py   facts, options and the training config -> the run's fixed settings and its memory plan
- recommend.py the precision decision table and the framework settings/snippets it renders
- advice.py    facts -> the decision's inputs; the `recommend` command's items
- search.py    the one entry point, prescribe(): candidates in the user's order of preference, each checked by
               `check`'s own rules on the training config the prescription prints; the first that passes, or none
               with the way out
"""
