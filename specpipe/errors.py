"""User-facing errors: one line that says what was wrong and what to do.

`cli.py` prints these without a traceback and exits with `exit_code`;
anything else that escapes is a bug and keeps its traceback. Exit codes are
listed in docs/faults.md.
"""

EXIT_RUN, EXIT_CONFIG = 1, 2


class SpecpipeError(Exception):
    """An error caused by input the user can fix (paths, config, models): exit 1."""

    exit_code = EXIT_RUN


class ConfigError(SpecpipeError):
    """The configuration alone is wrong, found before anything loads: exit 2."""

    exit_code = EXIT_CONFIG
