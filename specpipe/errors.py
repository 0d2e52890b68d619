"""User-facing errors: one line that says what was wrong and what to do.

`cli.py` prints these without a traceback and exits non-zero; anything else
that escapes is a bug and keeps its traceback.
"""


class SpecpipeError(Exception):
    """An error caused by input the user can fix (paths, config, models)."""
