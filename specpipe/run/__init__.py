"""One run, from models to run folder: `session.py` (models and plug-ins built once, a generation per prompt),
`runner.py` (`run(cfg)`: one generation into a run folder), `run_folder.py` (locked folders, atomic writes) and
`signals.py` (stop signals and exit codes). The consumers (cli/, bench/, serve/, tui/) sit on top of it.
"""
