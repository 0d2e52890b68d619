"""A draft model with another tokenizer: its own tokens for the context, the target's ids for its drafts.

`draft.vocab_map` (drafters/vocab_map.py has the token maps):

- `intersection` (token-level intersection, TLI): the draft's logits are restricted to the ids whose
  bytes the target's vocabulary has too (-inf elsewhere) and renormalised by the softmax, so its q is 0
  outside the shared set; each drafted id is moved to the target id with the same bytes and q with it.
  Rejection sampling is exact for any q, so the output follows the target's distribution; greedy
  verification keeps the target's argmax.
- `text` (universal assisted generation, UAG): the draft drafts greedily over its whole vocabulary;
  its tokens' text is re-encoded with the target's tokenizer together with the context's last few
  target tokens (OVERLAP), so a word the context ends in re-tokenises as the target would continue it.
  The drafts carry no probabilities: the comparator treats them as a point mass, as n-gram's, which
  is exact under rejection sampling too (a draft that is a function of the context *is* its own q);
  what greedy drafting costs under sampling is acceptance, never the distribution.

Token trees (`tree=static|dynamic`) go through `intersection` only: the draft's top-k chain (or its drawn
tree under sampling) is built in its own ids and moved node by node onto the target's, each node's q with
it; `text` re-encodes one chain of text and has no siblings to offer.

The draft's context is kept in its own tokens: the target's text since the last step (the accepted
drafts, the recovered or bonus token) is appended as bytes and encoded with the draft's tokenizer,
together with the draft tokens not yet in its cache (at least the newest), so a token boundary the new
text moves is re-encoded rather than kept. After a verify the cache keeps the drafted tokens whose
bytes lie wholly inside the accepted text; the rest of that text is encoded at the next step.

Example (byte target, draft with the merge "th"): context "the ca" is draft ids [th, e, " ", c, a];
the draft proposes [t, " ", s] (text "t s"); the target accepts "t" and recovers "," -> the draft
keeps [.., c, a, t], and the next step encodes "," after it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from specpipe.core.stages.draft import Draft
from specpipe.drafters.vocab_map import VocabMap, check_round_trip, choose, encode_bytes
from specpipe.errors import SpecpipeError

OVERLAP = 4  # target tokens of the context re-encoded with a text draft (UAG keeps a few)


class ChosenMap(NamedTuple):
    """The token map of a (target, draft) pair and the method a run drafts through: read-only, so every
    drafter on one loaded draft shares it (drafters/model.py `_once`): building it reads both vocabularies
    and, for `auto`, encodes a corpus, ~1-1.6 s for Qwen2.5-Coder and SmolLM2, which a server would
    otherwise add to every request's first token."""

    vmap: VocabMap
    method: str  # intersection | text
    coverage: float | None  # the share of the target's corpus tokens the draft reaches (auto judged by it)


def choose_map(target, draft, method: str, reason: str) -> ChosenMap:
    """The map for `draft.vocab_map=method` (auto | intersection | text); SpecpipeError (one line) for a pair
    that cannot be mapped. `reason`: how the tokenizers differ (same_vocabulary's words), for a refusal."""
    vmap = VocabMap(target, draft)
    check_round_trip(target.tokenizer, vmap.target_bytes, target.info.name)
    check_round_trip(draft.tokenizer, vmap.draft_bytes, draft.info.name)
    chosen, coverage = choose(method, vmap, target.tokenizer)
    if chosen == "intersection" and vmap.shared == 0:
        raise SpecpipeError(
            f"draft.vocab_map=intersection: {draft.info.name} and {target.info.name} share no token ({reason}): "
            "use draft.vocab_map=text, or a draft model of the target's family"
        )
    return ChosenMap(vmap, chosen, coverage)


class CrossVocab:
    """The draft side of a draft model whose tokenizer is not the target's (used by drafters/model.py): one
    per drafter, since it follows that drafter's context; the map itself is shared (ChosenMap)."""

    def __init__(self, target, draft, chosen: ChosenMap, sampler):
        """
        Args:
            target, draft: the two Engines.
            chosen: the pair's map and method (`choose_map`).
            sampler: the run's sampler (intersection drafts from it; text drafts greedily).
        """
        self.vmap, self.method, self.coverage = chosen
        self.sampler = sampler if self.method == "intersection" else None  # text: greedy, a point-mass draft
        self._t_tok, self._d_tok = target.tokenizer, draft.tokenizer
        # a byte the draft's vocabulary has no token for (SmolLM2 has none for 21 bytes UTF-8 text never
        # holds, which a random target emits) stands as "?" in the draft's context: the draft only guesses
        singles = self.vmap.draft_singles
        self._placeholder = singles.get(ord("?"), next(iter(singles.values()), 0))
        self.reset()

    @property
    def shared(self) -> int:
        return self.vmap.shared

    def reset(self) -> None:
        self._text = bytearray()  # the target context's bytes taken in so far
        self._t_len = 0  # target tokens taken in
        self._d_ids: list[int] = []  # the draft's own tokens for a prefix of _text
        self._d_lens: list[int] = []  # the bytes of _text each of them stands for
        self._d_end = 0  # bytes of _text that _d_ids stand for
        self._drafted: list[int] = []  # the last draft, in the draft's ids (empty: the step drafted nothing)
        self._proposal: list[int] = []  # ... and in the target's
        self._broken = False  # the text stopped round-tripping through the draft's tokens: plain steps from here

    def _t_bytes(self, ids) -> bytes:
        table = self.vmap.target_bytes
        return b"".join(table[i] if 0 <= i < len(table) else b"" for i in ids)

    def _d_bytes(self, ids) -> bytes:
        table = self.vmap.draft_bytes
        return b"".join(table[i] if 0 <= i < len(table) else b"" for i in ids)

    def prefill(self, prompt_ids: list[int]) -> list[int]:
        """The prompt in the draft's own tokens (a new generation)."""
        self.reset()
        self.own_ids(prompt_ids, cached=0)
        return list(self._d_ids)

    def own_ids(self, context_ids: list[int], cached: int) -> list[int] | None:
        """The draft's own tokens for `context_ids` (the draft cache holds the first `cached`); None when it
        cannot draft this step (nothing is new, or the text does not round-trip through the draft's tokens)."""
        self._text += self._t_bytes(context_ids[self._t_len :])
        self._t_len = len(context_ids)
        if self._broken:
            return None
        keep = min(cached, len(self._d_ids))  # tokens not in the cache are re-encoded with the new text
        self._d_end -= sum(self._d_lens[keep:])
        del self._d_ids[keep:], self._d_lens[keep:]
        tail = bytes(self._text[self._d_end :])
        new = encode_bytes(self._d_tok, tail, self.vmap.draft_bytes, self.vmap.draft_singles, self._placeholder)
        if new is None:
            self._broken = True  # never with a placeholder; kept for the type
            return None
        self._d_ids += new[0]
        self._d_lens += new[1]
        self._d_end = len(self._text)
        return self._d_ids if len(self._d_ids) > cached else None

    def to_target(self, draft: Draft, context_ids: list[int], k: int) -> Draft:
        """The draft model's Draft (its own ids and q) as the target's."""
        self._drafted = list(draft.token_ids)
        if self.method == "intersection":
            proposal = []
            for d in self._drafted:
                t = int(self.vmap.d2t[d]) if 0 <= d < len(self.vmap.d2t) else -1
                if t < 0:  # never: the mask keeps q at 0 outside the shared ids
                    break
                proposal.append(t)
            probs = draft.probs
            if probs is not None:
                probs = self.vmap.to_target(probs[: len(proposal)])
        else:
            proposal, probs = self._reencode(context_ids, self._drafted)[:k], None
        self._proposal = proposal
        return Draft(
            token_ids=proposal,
            probs=probs if proposal else None,
            catchup_tokens=draft.catchup_tokens,
            catchup_forwards=draft.catchup_forwards,
        )

    def tree_to_target(self, draft):
        """The draft model's TreeDraft (its own ids; a sampled tree's q per chain node) as the target's.

        Every node is a shared id (the mask keeps q at 0 elsewhere, and a node is one of the `width` best of
        masked logits), so each maps one to one; a node that did not (never while the shared set holds
        `width` ids) would leave with its subtree. The chain's cached tokens map the same way: the tree's
        rollback compares them with the accepted path, and `draft_kept` keeps the draft's own tokens of it."""
        from specpipe.trees.drafting import TreeDraft
        from specpipe.trees.tree import Drawn, TokenTree

        assert self.method == "intersection", "trees through a text map are refused before the first step"
        d2t, own = self.vmap.d2t, draft.candidates
        tree, index = TokenTree(), {-1: -1}  # own node -> target node (the root stays the root)
        for i, (token, parent, score) in enumerate(zip(own.tokens, own.parents, own.scores)):
            mapped = int(d2t[token]) if 0 <= token < len(d2t) else -1
            if mapped >= 0 and parent in index:
                index[i] = tree.add(mapped, index[parent], score)
        for path, drawn in own.drawn.items():
            moved = tuple(int(d2t[t]) for t in path)
            order = [int(d2t[t]) for t in drawn.order if d2t[t] >= 0]
            tree.drawn[moved] = Drawn(q=self._q_to_target(drawn.q), order=order)
        chain = list(draft.cached_tail)
        self._drafted = chain  # the draft tokens fed into its cache: what draft_kept keeps of the accepted path
        self._proposal = [int(d2t[t]) for t in chain]
        return TreeDraft(tree, cached_tail=self._proposal, catchup_tokens=draft.catchup_tokens, source=draft.source)

    def _q_to_target(self, q: np.ndarray) -> np.ndarray:
        """A node's q over the draft's ids -> over the target's: each shared id's mass at its target id."""
        out = np.zeros(self.vmap.target_rows, dtype=q.dtype)
        d, t = self.vmap.draft_ids, self.vmap.target_ids
        scored = (d < len(q)) & (t < len(out))  # ids both sides' logits score
        out[t[scored]] = q[d[scored]]
        return out

    def _reencode(self, context_ids: list[int], drafted: list[int]) -> list[int]:
        """Draft tokens -> target tokens through their text, the context's last target tokens as overlap."""
        data = self._d_bytes(drafted)
        if not data:
            return []
        singles = self.vmap.target_singles
        table = self.vmap.target_bytes
        rest: list[int] | None = None
        for size in range(min(OVERLAP, len(context_ids)), 0, -1):
            overlap = list(context_ids[-size:])
            enc = encode_bytes(self._t_tok, self._t_bytes(overlap) + data, table, singles)
            if enc is not None and enc[0][:size] == overlap:  # the context's tokens come back: the rest follows
                rest = enc[0][size:]
                break
        if rest is None:  # the boundary merges into the context's last tokens: the text on its own
            enc = encode_bytes(self._t_tok, data, table, singles)
            rest = enc[0] if enc is not None else None
        if rest is None or self._t_bytes(rest) != data:
            return []
        rows = self.vmap.target_rows  # an id the target's tokenizer has but its logits do not score: cut there
        return next((rest[:i] for i, t in enumerate(rest) if t >= rows), rest)

    def draft_kept(self, kept_len: int, cached: int) -> int:
        """After a verify that kept the first `kept_len` target tokens: how many of the draft cache's `cached`
        positions stay (its own tokens of the accepted text; the newest is left out, the next forward feeds it)."""
        if not self._drafted:
            return cached  # nothing drafted (a lookup draft or a plain step): the next step catches up
        kept = self._proposal[: max(0, kept_len - self._t_len)]  # the drafts the target accepted
        accepted = self._t_bytes(kept)
        m, total = 0, 0
        for d in self._drafted:
            size = len(self._d_bytes([d]))
            if total + size > len(accepted):
                break
            total, m = total + size, m + 1
        self._text += accepted
        self._t_len += len(kept)
        self._d_ids += self._drafted[:m]
        self._d_lens += [len(self._d_bytes([d])) for d in self._drafted[:m]]
        self._d_end += total
        self._drafted, self._proposal = [], []
        return max(0, min(len(self._d_ids) - 1, cached))
