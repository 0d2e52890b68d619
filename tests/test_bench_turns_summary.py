"""specpipe-bench-turns' closing lines (bench/turns.py `summary`): a path whose comparison did not run says so
instead of "yes" (a sitting of `--paths mlx_lm` alone printed "answers equal to session-off: yes" with no
session-off path to compare with), and a differing answer says NO."""

from __future__ import annotations

from specpipe.bench.turns import summary


def row(path: str, turn: int, ttft: float, same_off=None, same_session=None, new_only=None) -> dict:
    r = {"conversation": "doc", "turn": turn, "path": path, "ttft_s": ttft}
    r |= {"same_as_off": same_off, "same_as_session_off": same_session}
    if new_only is not None:
        r["new_only_s"] = new_only
    return r


def test_a_path_without_its_comparison_says_not_compared():
    lines = summary([row("mlx_lm", 1, 30.0), row("mlx_lm", 2, 2.0)])
    assert lines == [
        "[turns] doc mlx_lm: first 30.00s, later median 2.00s, answers equal to session-off: "
        "not compared (no session-off path)"
    ]


def test_equal_and_differing_answers():
    rows = [
        row("session-off", 1, 9.0, True, True, new_only=9.0),
        row("session-on", 1, 9.0, True, True),
        row("mlx_lm", 1, 9.5, None, True),
        row("session-off", 2, 9.5, True, True, new_only=0.4),
        row("session-on", 2, 0.5, False, False),
        row("mlx_lm", 2, 0.6, None, True),
    ]
    lines = summary(rows)
    assert lines[1] == (
        "[turns] doc session-on: first 9.00s, later median 0.50s = 1.2x new-only, answers equal to store-off: NO"
    )
    assert lines[2].endswith("answers equal to session-off: yes")
