"""`specpipe-bench`: the harness (`harness.py`), one timed run (`measure.py`), the results JSONL
(`records.py`), the report and plots (`report.py`, `plots.py`), the prompt suites (`suites/`).
"""
