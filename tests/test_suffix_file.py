"""draft.store_file (drafters/suffix_file.py): the suffix drafter's history survives the process as JSON of token
ids; a torn, foreign or hostile file is one line on stderr and a non-zero exit, and nothing in it runs."""

from __future__ import annotations

import json

import pytest
from conftest import run_module, tiny

from specpipe.core.plan import StepPlan
from specpipe.drafters.suffix import SuffixDrafter
from specpipe.drafters.suffix_file import read_store_file
from specpipe.drafters.suffix_store import HistoryShelf
from specpipe.errors import SpecpipeError


@pytest.fixture(scope="module")
def target():
    return tiny("llama")


def test_the_history_survives_the_process(tmp_path, target):
    path = tmp_path / "store.json"
    first = SuffixDrafter(max_n=4, store_file=str(path), history=HistoryShelf(), target=target)
    first.prefill([1, 2, 3])
    first.propose([1, 2, 3, 10, 11, 12, 13], StepPlan(k=4))
    first.prefill([40])  # the next request: the history so far is written
    later = SuffixDrafter(max_n=4, store_file=str(path), history=HistoryShelf(), target=target)  # a new process
    later.prefill([20, 11, 12])
    assert later.propose([20, 11, 12], StepPlan(k=4)).token_ids == [13]


@pytest.mark.parametrize(
    "content, why",
    [
        ('{"specpipe": "suffix-store", "version": 1, "model": "x", "sequ', "is torn or not JSON"),
        ('{"weights": [1, 2]}', "is not a specpipe suffix store"),
        ('{"specpipe": "suffix-store", "version": 1, "model": "other 00", "sequences": []}', "another model"),
        ('{"specpipe": "suffix-store", "version": 1, "model": "M", "sequences": [["os.system"]]}', "token ids"),
        ('{"specpipe": "suffix-store", "version": 1, "model": "M", "sequences": [[{"_target_": "os.system"}]]}', "ids"),
        ('{"specpipe": "suffix-store", "version": 1, "model": "M", "sequences": [[99999999999]]}', "token ids"),
        ('{"specpipe": "suffix-store", "version": 1, "model": "M", "sequences": [[true, -1]]}', "token ids"),
        ("[" * 100_000, "is torn or not JSON"),
    ],
)
def test_a_bad_store_file_is_one_line(tmp_path, target, content, why):
    path = tmp_path / "store.json"
    path.write_text(content.replace('"M"', json.dumps(f"{target.info.name} {target.info.sha256}")))
    with pytest.raises(SpecpipeError) as caught:
        read_store_file(path, f"{target.info.name} {target.info.sha256}")
    message = str(caught.value)
    assert why in message and "\n" not in message and "draft.store_file=" in message


def test_the_cli_refuses_a_torn_file_in_one_line(tmp_path):
    (tmp_path / "store.json").write_text('{"specpipe": "suffix-st')
    proc = run_module(
        "specpipe.cli", ["model=tiny-random", "draft=suffix", "draft.store_file=store.json", "max_tokens=4"], tmp_path
    )
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert any("draft.store_file=store.json is torn or not JSON" in line for line in lines), proc.stderr
    assert "Traceback" not in proc.stderr
