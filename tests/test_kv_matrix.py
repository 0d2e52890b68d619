"""Every `kv` choice x drafter x rollback strategy: greedy speculation emits the tokens of plain
decoding (draft=none) on the same KV choice, or the combination is refused in one line before
anything runs. tests/test_kv.py covers n-gram / self / draft model with trim at several K and two
architectures; this fills in the layer-skip and MTP drafters and the checkpoint and recompute
strategies for every drafter, on a tiny llama whose window cache wraps during the run."""

from __future__ import annotations

import pytest
from conftest import first_difference, generate, make_drafter, noisy_copy
from test_drafters_extra import random_head, run_with
from test_kv import MAX_TOKENS, POLICIES, TINY, engine

from specpipe.drafters.layerskip import LayerSkipDrafter
from specpipe.drafters.mtp import MtpDrafter
from specpipe.engine.kv import WindowKV
from specpipe.errors import SpecpipeError

DRAFTERS = ["ngram", "model", "layerskip", "mtp"]
ROLLBACKS = ["trim", "checkpoint", "recompute"]
K = 6


@pytest.fixture(scope="module", params=list(POLICIES))
def setup(request, tmp_path_factory):
    kv = POLICIES[request.param]
    if isinstance(kv, WindowKV):
        kv.margin = 20  # small, so the run drops old positions (a step gives back at most K + 1)
    target = engine("llama", kv)
    draft = noisy_copy(target, scale=0.5, tiny=TINY)
    draft.kv = kv
    prompt = target.encode_prompt("the cat sat on the mat, the cat sat on the", chat=False)
    baseline, _, _, _ = generate(target, make_drafter("none", target), 1, prompt, MAX_TOKENS)
    return target, draft, prompt, baseline, random_head(target, tmp_path_factory.mktemp("head"))


def drafter_for(kind: str, target, draft, head):
    if kind == "layerskip":
        return LayerSkipDrafter(target=target, depth=1)
    if kind == "mtp":
        return MtpDrafter(target=target, head=head)
    return make_drafter(kind, target, draft)


@pytest.mark.parametrize("rollback", ROLLBACKS)
@pytest.mark.parametrize("kind", DRAFTERS)
def test_greedy_equals_plain_on_the_same_kv(setup, kind, rollback):
    target, draft, prompt, baseline, head = setup
    try:
        got = run_with(target, drafter_for(kind, target, draft, head), rollback, K, prompt, MAX_TOKENS)
    except SpecpipeError as exc:
        pytest.fail(f"refused: {exc}")
    assert got == baseline, first_difference(target, prompt, baseline, got)
