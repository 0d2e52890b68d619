"""The decoding loop and what it is made of: `step.py` (one step over rows), `pipeline.py` (the CLI's run
driver), `admission.py` / `finish.py` (a request's start and end, both drivers'), `row.py` / `storage.py` (a row
and where its K/V lives), `stages/` (draft, verify, compare, rollback, bonus), `protocols.py` (the plug-in
contracts), `plan.py` (StepPlan, RunControl), `sampling.py`.
Nothing here loads a model; the engine is reached only through `specpipe.engine.Engine`.
"""
