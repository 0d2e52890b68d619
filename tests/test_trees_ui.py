"""Token trees in the consumers: RunStarted carries the shape, the transcript counts the branches
each step tried and keeps the accepted path as the accepted span, and a recorded tree run replays
(events.jsonl -> ReplaySource) to the same answer and figures."""

from __future__ import annotations

from tui_script import scripted_tree_events

from specpipe.core.pipeline import RunControl
from tui.figures import Figures, short_tree
from tui.sources import ReplaySource
from tui.transcript import ACCEPTED, REJECTED, AnswerTranscript, branch_count


def test_branch_count_and_short_labels():
    assert branch_count([-1, 0, 0, -1]) == 3
    assert branch_count([-1, 0, 1]) == 1 and branch_count([]) == 0
    assert short_tree("dynamic(nodes=16, depth=8, width=4)") == "dynamic(16)"
    assert short_tree("static([4, 2, 1, 1])") == "static([4, 2, 1, 1])"


def test_transcript_counts_branches_and_marks_the_other_nodes():
    transcript = AnswerTranscript()
    for event in scripted_tree_events():
        transcript.consume(event)
    assert transcript.branches == [3, 2, 1, 0]
    assert transcript.steps == [(2, 2), (2, 0), (2, 2), (0, 0)]  # (tree depth, path length)
    assert [p.text for p in transcript.pieces if p.kind == ACCEPTED] == ["def add", " b):"]
    assert [p.text for p in transcript.pieces if p.kind == REJECTED] == [
        "\u27e82 other nodes\u27e9",
        "\u27e83 other nodes\u27e9",
    ]
    assert transcript.text == "def add(a,  b):\n# done"


def test_recorded_tree_run_replays(tmp_path):
    """A real tree run (tiny model, budget=auto, tree=dynamic) written by the runner replays to the same
    answer, the same figures and the tree label."""
    from test_trees import _compose

    from specpipe.run.runner import run

    cfg = _compose(
        [
            "model=tiny-random",
            "tree=dynamic",
            "tree.nodes=8",
            "budget=auto",
            "max_tokens=24",
            "prompt.text='the cat sat on the mat, the cat sat on the'",
        ]
    )
    result = run(cfg, out_dir=tmp_path / "run")
    source = ReplaySource.from_file(tmp_path / "run" / "events.jsonl", speed=0)
    transcript, figures = AnswerTranscript(), Figures()
    for event in source.generate([], RunControl()):
        transcript.consume(event)
        figures.consume(event)
    assert transcript.text == result.text and len(transcript.steps) == result.stats.steps
    assert figures.tree == "dynamic(nodes=8, depth=8, width=4)"
    assert dict(figures.rows())["tok/forward"] == f"{result.stats.tokens_per_forward:.2f}"
    assert len(transcript.branches) == result.stats.steps
