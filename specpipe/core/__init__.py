"""The decoding loop and what it is made of: `pipeline.py` (the step loop), `stages/` (draft,
verify, compare, rollback, bonus), `protocols.py` (the plug-in contracts), `sampling.py`.
Nothing here loads a model; the engine is reached only through `specpipe.engine.Engine`.
"""
