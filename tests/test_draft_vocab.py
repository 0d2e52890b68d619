"""`draft=model draft.vocab=N`: the draft's LM head scores N frequent ids plus the context's.

The cut head must give exactly the full head's logits on the rows it keeps and -inf elsewhere (float
and quantized heads, tied or not); the output must stay equal to the target decoding alone for every
architecture, chain and tree, fixed and auto, and recurrent drafts through their rollback; heads that
cannot be cut are refused in one line when asked for and quietly kept whole by default.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import first_difference, noisy_copy, prepared, tiny

from specpipe.budgets.auto import AutoBudget
from specpipe.budgets.fixed import FixedBudget
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.costmodel.calibration import draft_cost
from specpipe.drafters import draft_vocab
from specpipe.drafters import model as model_drafter
from specpipe.drafters.draft_vocab import DraftVocab, frequent_ids, head_module
from specpipe.drafters.model import ModelDrafter
from specpipe.drafters.none import NoneDrafter
from specpipe.engine.load.loader import load_engine
from specpipe.errors import SpecpipeError
from specpipe.events import Drafted, RunFinished
from specpipe.rollbacks.checkpoint import CheckpointRollback
from specpipe.rollbacks.trim import TrimRollback
from specpipe.trees.proposal import tree_parts
from specpipe.trees.shape import TreeShape

PROMPT = "the cat sat on the mat; the cat sat on the hat; the dog"  # 55 ids: + 40 passes gemma3's 64 window
KEEP = 6  # of the tiny models' 259 ids: most of the prompt's characters are not among the 6 most used


def run(target, drafter, budget, prompt, max_tokens=40, tree=None, rollback=None):
    rollback = rollback or TrimRollback()
    step = tree_parts(target, drafter, tree) if tree else None
    pipe = SpeculativePipeline(target, drafter, budget, GreedyComparator(), rollback, GreedyBonus(), tree=step)
    events = list(pipe.run(prompt, max_tokens, stop_ids=set()))
    assert isinstance(events[-1], RunFinished)
    return events[-1].token_ids, [e for e in events if isinstance(e, Drafted)]


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("precision", ["float32", "mlx4"])
def test_the_cut_head_gives_the_full_heads_logits_on_its_rows_and_minus_inf_elsewhere(tied, precision):
    engine = load_engine("tiny-random", precision=precision, arch="llama", seed=2, tiny={"tie_word_embeddings": tied})
    inner, head = engine.hidden_parts()
    vocab = DraftVocab(head_module(engine.model, inner, "draft.vocab=6"), range(KEEP), always=[258])
    vocab.reset([100, 7, 200, 100])
    hidden = inner(mx.array([[5, 100, 17]], dtype=mx.uint32))[0]
    full, cut = head(hidden), vocab.logits(hidden)
    kept = sorted({*range(KEEP), 258, 100, 7, 200})
    dropped = sorted(set(range(full.shape[-1])) - set(kept))
    assert vocab.rows == len(kept) and cut.shape == full.shape and cut.dtype == mx.float32
    assert mx.allclose(cut[:, mx.array(kept)], full[:, mx.array(kept)].astype(mx.float32), rtol=1e-5, atol=1e-5).item()
    assert mx.all(mx.isinf(cut[:, mx.array(dropped)]) & (cut[:, mx.array(dropped)] < 0)).item()
    vocab.add([201, 5])  # an id the target emitted joins the rows; one already kept changes nothing
    assert vocab.rows == len(kept) + 1 and not mx.isinf(vocab.logits(hidden)[0, 201]).item()


CASES = [(a, m) for a in ("llama", "qwen2", "qwen3", "mistral") for m in ("fixed", "auto", "tree")]
CASES += [("gemma3_text", "fixed"), ("gemma3_text", "auto")]  # sliding window past its wrap; no trees there


@pytest.mark.parametrize(("arch", "mode"), CASES)
def test_a_cut_draft_head_is_lossless_and_drafts_only_kept_ids(arch, mode):
    target = tiny(arch)
    draft = noisy_copy(target, scale=0.3)
    prompt = target.encode_prompt(PROMPT, chat=False)
    baseline, _ = run(target, NoneDrafter(), FixedBudget(k=1), prompt)
    drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other", vocab=KEEP)
    # the cut head's drafts, not the prefill's price: a draft the target's size repays no prefill of a short
    # answer, and budget=auto would decline it (that choice: tests/test_prefill_price.py)
    drafter.plans_prefill = False
    budget = prepared(AutoBudget(), target, drafter) if mode == "auto" else FixedBudget(k=6)
    shape = TreeShape(kind="dynamic", nodes=8, depth=4, branching=[3] * 4) if mode == "tree" else None
    got, drafted = run(target, drafter, budget, prompt, tree=shape)
    assert got == baseline, first_difference(target, prompt, baseline, got)
    proposed = {t for e in drafted for t in e.draft_ids}
    assert proposed and proposed <= drafter._vocab.ids()
    assert drafter._vocab.ids() >= set(prompt)  # the prompt's ids joined the rows (the output's join per draft)
    if mode == "fixed":  # every step drafts, so every emitted id but the last step's joined the rows
        assert drafter._vocab.ids() >= set(baseline[:-7])
    assert not set(prompt) <= set(frequent_ids(target.tokenizer, KEEP)), "the prompt must need the context rows"
    assert drafter._vocab is not None and drafter._vocab.rows < drafter._vocab.vocab


def test_a_recurrent_draft_with_a_cut_head_rolls_back_through_its_states():
    target = tiny("qwen3_next")
    draft = noisy_copy(target, scale=0.03)
    prompt = target.encode_prompt(PROMPT, chat=False)
    baseline, _ = run(target, NoneDrafter(), FixedBudget(k=1), prompt, 32, rollback=CheckpointRollback())
    drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other", vocab=KEEP)
    got, _ = run(target, drafter, FixedBudget(k=4), prompt, 32, rollback=CheckpointRollback())
    assert got == baseline, first_difference(target, prompt, baseline, got)


def test_frequent_ids_rank_what_the_corpus_uses_first_and_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path))
    tokenizer = tiny("llama").tokenizer
    ranked = frequent_ids(tokenizer, 200)
    assert len(ranked) == len(set(ranked)) == 200
    e, space, tilde = (tokenizer.get_vocab()[c] for c in ("e", "Ġ", "~"))
    assert ranked.index(e) < ranked.index(tilde) and ranked.index(space) < ranked.index(tilde)  # code is not ~-heavy
    assert list(tmp_path.glob("draft_vocab/*.npy"))  # counted once per tokenizer, then read
    monkeypatch.setattr(draft_vocab, "_corpus", lambda: pytest.fail("counted again"))
    assert frequent_ids(tokenizer, 200) == ranked


def test_a_context_word_keeps_its_case_and_space_variants():
    target = tiny("llama")
    draft = noisy_copy(target, scale=0.3)
    drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other", vocab=KEEP)
    vocab = target.tokenizer.get_vocab()
    drafter.prefill([vocab["q"]])
    assert vocab["Q"] in drafter._vocab.ids()


def test_the_cut_head_lowers_the_draft_cost_auto_starts_from():
    target = tiny("llama")
    draft = noisy_copy(target, scale=0.3)
    whole = ModelDrafter(target=target, load=lambda **_: draft, model="other", vocab=0)
    cut = ModelDrafter(target=target, load=lambda **_: draft, model="other", vocab=KEEP)
    assert whole._vocab is None and whole.bytes_share == 1.0
    assert 0 < cut.bytes_share < 1.0
    assert draft_cost(cut, target) == pytest.approx(cut.bytes_share * draft_cost(whole, target))


def test_by_default_the_head_is_cut_where_it_can_be_and_kept_whole_elsewhere(monkeypatch):
    monkeypatch.setattr(model_drafter, "DEFAULT_VOCAB", KEEP)
    target = tiny("llama")
    assert ModelDrafter(target=target, load=lambda **_: noisy_copy(target, 0.3), model="other")._vocab is not None
    assert ModelDrafter(target=target, load=None, model="self")._vocab is None  # a self-test keeps its head
    mamba = tiny("mamba2")
    assert ModelDrafter(target=mamba, load=lambda **_: tiny("mamba2", seed=1), model="other")._vocab is None


def test_asking_for_a_cut_the_draft_cannot_take_is_refused_in_one_line():
    mamba = tiny("mamba2")
    with pytest.raises(SpecpipeError, match=r"draft.vocab=6: .* use draft.vocab=0") as e:
        ModelDrafter(target=mamba, load=None, model="self", vocab=KEEP)
    assert "\n" not in str(e.value)
    with pytest.raises(SpecpipeError, match="draft.vocab=-1 is out of range"):
        ModelDrafter(target=tiny("llama"), load=None, model="self", vocab=-1)


def test_a_cut_at_or_above_the_vocabulary_keeps_the_whole_head():
    target = tiny("llama")
    assert ModelDrafter(target=target, load=None, model="self", vocab=100_000)._vocab is None


def test_drafters_on_one_draft_model_share_its_cut_head_but_not_their_contexts_rows():
    """A server builds a drafter per request on one loaded draft: the head cut is gathered once and shared (it
    took ~1 s of each request's first token for the 0.5B draft), each drafter's context rows stay its own."""
    target = tiny("llama")
    draft = noisy_copy(target, scale=0.3)
    first, second = (ModelDrafter(target=target, load=lambda **_: draft, model="other", vocab=KEEP) for _ in range(2))
    assert first._vocab is not second._vocab and first._vocab._base is second._vocab._base  # one gathered copy
    base = second._vocab.ids()
    first.prefill(target.encode_prompt(PROMPT, chat=False))
    assert first._vocab.ids() > base, "the prompt's ids joined the first drafter's rows"
    assert second._vocab.ids() == base, "and not the second's"
