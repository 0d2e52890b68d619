"""Cross-tokenizer drafting (draft.vocab_map): a draft model with another tokenizer drafts for the target.

Greedy output equals the target decoding alone for both maps, with real tokenizers (SmolLM2's BPE and the
tiny byte tokenizer) and with a draft that agrees with the target under renumbered ids (so drafts are
accepted and every rollback path runs); under sampling the intersection map keeps the target's
distribution (chi-square, test_sampling's helpers), and a map that moves q to the wrong ids is caught."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import generate, make_drafter, tiny
from mlx.utils import tree_flatten

from specpipe.core.plan import StepPlan
from specpipe.drafters.model import ModelDrafter
from specpipe.drafters.vocab_map import VocabMap, encode_bytes, token_bytes
from specpipe.engine.engine import Engine
from specpipe.engine.load.loader import load_engine
from specpipe.engine.load.tiny import SPECIALS, build_tiny, byte_tokenizer


def with_tokenizer(model, hf_tokenizer, name: str) -> Engine:
    """An Engine of `model` that speaks `hf_tokenizer` (mlx-lm's wrapper, as the loader builds it)."""
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper

    from specpipe.engine.info import ModelInfo

    wrapper = TokenizerWrapper(hf_tokenizer, BPEStreamingDetokenizer, eos_token_ids=[hf_tokenizer.eos_token_id])
    return Engine(model, wrapper, ModelInfo(name=name, source="test", arch="llama", precision="", sha256=name))


def renumbered_tokenizer(chars: list[str], merges: list[tuple[str, str]] = ()):
    """A byte-level tokenizer whose ids are `chars` in this order (+ the merges' tokens, then the specials)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(chars)}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    for special in SPECIALS:
        vocab[special] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", unk_token="<|endoftext|>", additional_special_tokens=SPECIALS
    )


def renumbered_draft(target: Engine, order: list[int], extra_rows: int, noise: float, seed: int = 1) -> Engine:
    """A draft that computes what `target` does (plus noise) with the target's ids renumbered: draft id i is
    target id order[i] (-1: a token the target lacks, a random row); `extra_rows` more random rows follow."""
    from specpipe.engine.load.tiny import _BASE

    t_vocab = target.vocab_size
    rows = len(order) + extra_rows
    model, _ = build_tiny("llama", seed=5, overrides={"vocab_size": rows})
    key = mx.random.key(seed)
    params = []
    take = mx.array([max(o, 0) for o in order])
    known = mx.array([o >= 0 for o in order])[:, None]
    for path, value in tree_flatten(target.model.parameters()):
        key, sub = mx.random.split(key)
        value = value + noise * mx.random.normal(value.shape, key=sub) * mx.std(value)
        if value.ndim == 2 and value.shape[0] == t_vocab:  # embedding and LM head rows follow the renumbering
            key, sub = mx.random.split(key)
            fresh = mx.random.normal((rows, value.shape[1]), key=sub)
            moved = mx.where(known, value[take], fresh[: len(order)])
            value = mx.concatenate([moved, fresh[len(order) :]]) if extra_rows else moved
        params.append((path, value))
    model.load_weights(params)
    mx.eval(model.parameters())
    assert _BASE["tie_word_embeddings"] is False  # both rows sets are moved above
    return model


@pytest.fixture(scope="module")
def renumbered_pair():
    """The tiny byte target, and a noisy copy whose tokenizer numbers the bytes in reverse and merges "t"+"h"
    (a token the target has no id for): different tokenizers, drafts the target mostly accepts."""
    target = tiny("llama")
    alphabet = [token for token, _ in sorted(byte_tokenizer().get_vocab().items(), key=lambda kv: kv[1])][:256]
    chars = alphabet[::-1]
    order = [255 - i for i in range(256)]  # draft id i is the target's byte 255 - i
    hf = renumbered_tokenizer(chars, merges=[("t", "h")])
    order += [-1] + [256 + i for i in range(len(SPECIALS))]  # "th" has no target id; the specials keep theirs
    draft = with_tokenizer(renumbered_draft(target, order, 0, noise=0.3), hf, "renumbered-bytes")
    return target, draft


def test_the_map_pairs_ids_by_their_bytes(renumbered_pair):
    target, draft = renumbered_pair
    vmap = VocabMap(target, draft)
    assert vmap.shared == 256 + len(SPECIALS)  # every byte and special; "th" is the draft's alone
    a = target.tokenizer.get_vocab()["a"]
    assert vmap.d2t[draft.tokenizer.get_vocab()["a"]] == a and vmap.d2t[draft.tokenizer.get_vocab()["th"]] == -1
    q = mx.zeros((1, draft.vocab_size)).at[0, draft.tokenizer.get_vocab()["a"]].add(1.0)
    assert vmap.to_target(q)[0, a].item() == 1.0 and mx.sum(vmap.to_target(q)).item() == 1.0


def test_smollm2_tokens_decode_to_their_bytes(smollm2):
    table, added = token_bytes(smollm2.tokenizer)
    ids = smollm2.tokenizer.encode(" hello wörld\n\tdef", add_special_tokens=False)
    assert b"".join(table[i] for i in ids) == " hello wörld\n\tdef".encode()
    assert table[2] == b"<|im_end|>" and 2 in added
    vmap = VocabMap(smollm2, tiny("llama"))
    ids, lens = encode_bytes(smollm2.tokenizer, b"ab\xc3", vmap.target_bytes, vmap.target_singles)
    assert lens == [1, 1, 1] or sum(lens) == 3  # "ab" and the lone first byte of a split character


@pytest.mark.parametrize("vocab_map", ["intersection", "text"])
def test_renumbered_draft_is_lossless_and_accepted(renumbered_pair, vocab_map):
    target, draft = renumbered_pair
    prompt = target.encode_prompt("the cat sat on the mat, the cat sat on the", chat=False)
    baseline, _, _, _ = generate(target, make_drafter("none", target), 1, prompt, 40)
    drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other", vocab_map=vocab_map)
    assert drafter.vocab_map == vocab_map
    tokens, final, _, _ = generate(target, drafter, 4, prompt, 40)
    assert tokens == baseline
    assert final.stats.accepted > 0 and final.stats.accepted < final.stats.drafted  # accepts and rejections


@pytest.mark.parametrize("vocab_map", ["intersection", "text", "auto"])
def test_bpe_target_drafted_by_a_byte_model_equals_plain(smollm2, vocab_map):
    """A tiny random target with SmolLM2's BPE tokenizer (49,152 ids), drafted by a tiny byte-tokenizer model."""
    model, _ = build_tiny("llama", seed=2, overrides={"vocab_size": smollm2.vocab_size})
    target = Engine(model, smollm2.tokenizer, smollm2.info)
    draft = tiny("llama", seed=4)
    prompt = target.encode_prompt("def add(a, b):\n    return a + b\n\ndef add(a, b):", chat=False)
    baseline, _, _, _ = generate(target, make_drafter("none", target), 1, prompt, 24)
    drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other", vocab_map=vocab_map)
    tokens, final, _, _ = generate(target, drafter, 4, prompt, 24)
    assert tokens == baseline and final.stats.drafted > 0
    # a byte draft reaches only the one-byte BPE tokens: auto judges that too little of the target's text
    assert drafter.vocab_map == ("text" if vocab_map == "auto" else vocab_map)


# ---------------------------------------------------------------- sampling: the target's distribution


@pytest.fixture(scope="module")
def small_renumbered_pair():
    """test_sampling's 8-id target, and a draft over 8 ids of which 6 are the target's (renumbered) and 2
    are bytes the target cannot score: q is 0 on those, and 2 target ids are out of the draft's reach."""
    from test_sampling import VOCAB

    target = load_engine("tiny-random", precision="float32", arch="llama", seed=3, tiny={"vocab_size": VOCAB})
    alphabet = [token for token, _ in sorted(byte_tokenizer().get_vocab().items(), key=lambda kv: kv[1])][:256]
    order = [5, 3, -1, 0, 7, -1, 1, 2]  # draft id -> target id; -1: a byte beyond the target's 8 rows
    chars = [alphabet[o] if o >= 0 else alphabet[100 + i] for i, o in enumerate(order)]
    chars += [ch for ch in alphabet if ch not in chars]  # the rest of the bytes, past the draft's 8 rows
    model = renumbered_draft(target, order, 0, noise=1.0, seed=7)
    return target, with_tokenizer(model, renumbered_tokenizer(chars), "renumbered-8")


RUNS = 500  # fewer than test_sampling's 1500: enough to catch the broken map below, a third of the time


def intersection_counts(target, draft, sampler, prompt, vocab_map="intersection"):
    from test_sampling import sample_pairs

    from specpipe.core.stages.compare import RejectionComparator

    drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other", sampler=sampler, vocab_map=vocab_map)
    assert drafter.vocab_shared == 6
    return sample_pairs(target, drafter, RejectionComparator, sampler, prompt)


@pytest.mark.statistical
@pytest.mark.parametrize("vocab_map", ["intersection", "text"])
def test_mapped_sampling_keeps_the_target_distribution(small_renumbered_pair, monkeypatch, vocab_map):
    """intersection: q moved onto the target's ids; text: greedy drafts as a point mass (as n-gram's)."""
    from test_sampling import chi_square_rejects, exact_joint

    from specpipe.core.sampling import Sampler

    target, draft = small_renumbered_pair
    monkeypatch.setattr("test_sampling.N_RUNS", RUNS)  # read by sample_pairs and chi_square_rejects
    sampler = Sampler(temperature=1.0, top_k=6)
    prompt = [1, 2, 3, 1, 2]
    joint = exact_joint(target, sampler, prompt)
    rejects, stat, critical = chi_square_rejects(intersection_counts(target, draft, sampler, prompt, vocab_map), joint)
    assert not rejects, f"chi-square {stat:.1f} > {critical:.1f}: output is not the target's distribution"


@pytest.mark.statistical
def test_a_map_that_moves_q_to_the_wrong_ids_is_caught(small_renumbered_pair, monkeypatch):
    """The same test fails a map that hands the comparator q in the draft's own numbering."""
    from test_sampling import chi_square_rejects, exact_joint

    from specpipe.core.sampling import Sampler

    target, draft = small_renumbered_pair
    monkeypatch.setattr("test_sampling.N_RUNS", RUNS)
    monkeypatch.setattr(VocabMap, "to_target", lambda self, q: q[:, : self.target_rows])
    sampler = Sampler(temperature=1.0, top_k=6)
    prompt = [1, 2, 3, 1, 2]
    joint = exact_joint(target, sampler, prompt)
    rejects, stat, critical = chi_square_rejects(intersection_counts(target, draft, sampler, prompt), joint)
    assert rejects, f"chi-square {stat:.1f} <= {critical:.1f}: the broken map went unnoticed"


def test_q_sums_to_one_on_the_shared_ids(small_renumbered_pair):
    """Sampled drafts carry q over the target's ids: zero off the shared set, one in total."""
    from specpipe.core.sampling import Sampler

    target, draft = small_renumbered_pair
    sampler = Sampler(temperature=1.0, seed=0)
    drafter = ModelDrafter(
        target=target, load=lambda **_: draft, model="other", sampler=sampler, vocab_map="intersection"
    )
    drafter.prefill([1, 2, 3, 1, 2])
    proposal = drafter.propose([1, 2, 3, 1, 2], StepPlan(k=3))
    q = np.array(proposal.probs)
    assert q.shape == (len(proposal.token_ids), target.vocab_size)
    assert np.allclose(q.sum(axis=1), 1.0, atol=1e-5) and np.all(q[:, [4, 6]] == 0)  # ids 4, 6: out of reach


# ---------------------------------------------------------------- token trees through the intersection map

TREE_SHAPES = {
    "static": {"kind": "static", "branching": [3, 2, 1, 1]},
    "dynamic": {"kind": "dynamic", "nodes": 8, "depth": 4, "branching": [3, 2, 2, 1]},
}


def tree_run(target, drafter, shape, prompt, max_tokens, sampler=None, comparator=None, bonus=None):
    from specpipe.budgets.fixed import FixedBudget
    from specpipe.core.pipeline import SpeculativePipeline
    from specpipe.core.stages.bonus import GreedyBonus
    from specpipe.core.stages.compare import GreedyComparator
    from specpipe.rollbacks.trim import TrimRollback
    from specpipe.trees.proposal import tree_parts

    pipe = SpeculativePipeline(
        target,
        drafter,
        FixedBudget(k=8),
        comparator or GreedyComparator(),
        TrimRollback(),
        bonus or GreedyBonus(),
        tree=tree_parts(target, drafter, shape),
    )
    return list(pipe.run(prompt, max_tokens, stop_ids=set()))


@pytest.mark.parametrize("shape", list(TREE_SHAPES))
def test_intersection_trees_equal_plain_and_are_accepted(renumbered_pair, shape):
    """The renumbered draft's tree, moved onto the target's ids, verifies to plain decoding's tokens; its paths
    are accepted (the draft's context follows the accepted path), more per forward than the same draft's chain
    (1.6 against 1.25 tokens: a sibling is accepted where the chain's token was not)."""
    from specpipe.events import Verified
    from specpipe.trees.shape import TreeShape

    target, draft = renumbered_pair
    prompt = target.encode_prompt("the cat sat on the mat, the cat sat on the", chat=False)
    baseline, _, _, _ = generate(target, make_drafter("none", target), 1, prompt, 40)
    drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other", vocab_map="intersection")
    events = tree_run(target, drafter, TreeShape(**TREE_SHAPES[shape]), prompt, 40)
    assert events[-1].token_ids == baseline
    verified = [e for e in events if isinstance(e, Verified) and e.tree_depth]
    assert verified and any(e.rejected_ids for e in verified)
    chain = ModelDrafter(target=target, load=lambda **_: draft, model="other", vocab_map="intersection")
    _, chained, _, _ = generate(target, chain, 4, prompt, 40)
    assert events[-1].stats.tokens_per_forward > chained.stats.tokens_per_forward > 1.0


def test_a_text_map_refuses_trees_in_one_line(renumbered_pair):
    from specpipe.errors import SpecpipeError
    from specpipe.trees.proposal import tree_parts
    from specpipe.trees.shape import TreeShape

    target, draft = renumbered_pair
    drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other", vocab_map="text")
    with pytest.raises(SpecpipeError) as err:
        tree_parts(target, drafter, TreeShape(**TREE_SHAPES["static"]))
    assert "draft.vocab_map=intersection" in str(err.value) and "\n" not in str(err.value)


def mapped_tree_counts(target, draft, sampler, prompt):
    """The first two tokens of seeded runs whose steps verify sampled trees drafted through the map."""
    from collections import Counter

    from test_sampling import N_RUNS

    from specpipe.core.stages.bonus import SampledBonus
    from specpipe.core.stages.compare import RejectionComparator
    from specpipe.trees.shape import TreeShape

    drafter = ModelDrafter(
        target=target, load=lambda **_: draft, model="other", sampler=sampler, vocab_map="intersection"
    )
    drafter.prefill_after_first_token = False  # the first step drafts a tree (not a plain step)
    shape = TreeShape(kind="static", branching=[3, 2])
    counts: Counter = Counter()
    for seed in range(N_RUNS):
        sampler.seed = seed
        sampler.reset()
        events = tree_run(
            target,
            drafter,
            shape,
            prompt,
            3,
            sampler,
            RejectionComparator(sampler=sampler),
            SampledBonus(sampler=sampler),
        )
        counts[tuple(events[-1].token_ids[:2])] += 1
    return counts


@pytest.mark.statistical
@pytest.mark.parametrize("broken", [False, True])
def test_mapped_sampled_trees_keep_the_target_distribution(small_renumbered_pair, monkeypatch, broken):
    """Sampled trees through the intersection map (each node's q moved onto the target's ids) emit the target's
    distribution; the same test fails a map that leaves a node's q in the draft's own numbering."""
    from test_sampling import chi_square_rejects, exact_joint

    from specpipe.core.sampling import Sampler
    from specpipe.drafters.cross_vocab import CrossVocab

    target, draft = small_renumbered_pair
    monkeypatch.setattr("test_sampling.N_RUNS", RUNS)
    if broken:
        monkeypatch.setattr(CrossVocab, "_q_to_target", lambda self, q: q[: self.vmap.target_rows].copy())
    sampler = Sampler(temperature=2.0, top_k=6)  # flat enough that drawn siblings are tried
    prompt = [1, 2, 3, 1, 2]
    rejects, stat, critical = chi_square_rejects(
        mapped_tree_counts(target, draft, sampler, prompt), exact_joint(target, sampler, prompt)
    )
    if broken:
        assert rejects, f"chi-square {stat:.1f} <= {critical:.1f}: the broken map went unnoticed"
    else:
        assert not rejects, f"chi-square {stat:.1f} > {critical:.1f}: output is not the target's distribution"


def test_drafters_on_one_loaded_draft_share_its_map(renumbered_pair):
    """A server builds a drafter per request: the map (both vocabularies read, ~1 s for Qwen and SmolLM2) is
    built once per loaded draft and method, each drafter following its own context through it."""
    target, draft = renumbered_pair
    a, b = (ModelDrafter(target=target, load=lambda **_: draft, model="other", vocab_map="text") for _ in range(2))
    assert a._cross is not None and b._cross is not None and a._cross is not b._cross
    assert a._cross.vmap is b._cross.vmap
    other = ModelDrafter(target=target, load=lambda **_: draft, model="other", vocab_map="intersection")
    assert other.vocab_map == "intersection" and b.vocab_map == "text"
