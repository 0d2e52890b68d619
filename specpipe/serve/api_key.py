"""The server's API key kept off the disk: Hydra writes every override into the run folder (`.hydra/config.yaml`,
`overrides.yaml`, `hydra.yaml`, mode 0644), so `api_key=KEY` never reaches Hydra.

Contract: `key_off_the_command_line(argv)` returns argv with `api_key=KEY` (`+api_key=`, `++api_key=`) replaced
by `api_key=null` and puts KEY in `$SPECPIPE_API_KEY`, which the server reads when `api_key` is null and which
nothing writes to a file. A shared config folder may not set `api_key` at all (shared_config.py).
"""

from __future__ import annotations

import os

API_KEY_ENV = "SPECPIPE_API_KEY"


def key_off_the_command_line(argv: list[str]) -> list[str]:
    """argv without the key's value; the last `api_key=KEY` given wins, as Hydra's would."""
    out = []
    for arg in argv:
        name, eq, value = arg.partition("=")
        if eq and name.lstrip("+") == "api_key" and value not in ("", "null", "None"):
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]  # Hydra's quoting: api_key='k,ey'
            os.environ[API_KEY_ENV] = value
            arg = f"{name}=null"
        out.append(arg)
    return out
