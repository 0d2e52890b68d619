"""The console scripts' shell: one Hydra entry wrapper (`shell.py`) that every command
(`specpipe`, `specpipe-bench`, `specpipe-calibrate`, `specpipe-chat`, `specpipe-serve`,
`specpipe-train-drafter`) runs through, the argv preparation it applies (`argv.py`), and the
`specpipe` and `specpipe-calibrate` commands themselves (`generate.py`, `calibrate.py`).
"""
