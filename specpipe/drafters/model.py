"""`draft=model`: a smaller model drafts greedily (or from the sampler's q).

A draft model with another tokenizer drafts through a token map (`draft.vocab_map=auto | intersection |
text`, drafters/cross_vocab.py): its cache holds its own tokens for the context, its drafts reach the
pipeline as the target's ids.

`draft.model=self` drafts with the target's own weights (separate cache):
a self-test whose greedy acceptance must be 1.0. The draft cache holds the
context plus the first k-1 drafted tokens after `propose`; `rollback(kept_len)`
brings it back to the accepted prefix through the run's rollback strategy
(bound by `use_rollback`), which sees every forward of the step: its
`before_forward` runs before the first one and what it asks to capture is
passed to each.

`draft.lookup_min_n=n` (0: off) puts a prompt lookup in front of the model:
where the context's last n or more tokens occurred earlier, what followed
them is the draft and no draft forward runs (the draft cache catches up on
the accepted tokens in the next model draft's first forward, as after plain
steps). Code edits copy long spans of their input, where the lookup is right
as often as the model and free; elsewhere the model drafts. Such a draft's
`last_evidence` is the matched n and `evidence_is_free` says so: budget=auto
prices those drafts at no draft cost, with rates of their own, and lets the
lookup draft up to its k_max (the plan's `lookup_k`) whatever K it gives the model, even
K = 0; a fixed budget's K caps both. With a token tree the lookup proposes the
trie of earlier matches' continuations (trees/drafting.py); the tree budget
prices it like the model's tree. Left unset (null, the default), the lookup is
asked only on a request whose prefill budget=auto skipped ("none"): such a
request would otherwise decode plain, and on a long prompt with a short answer
the copied spans pay where the model's prefill does not.

Its prefill waits for the target's first token (`prefill_after_first_token`):
the pipeline gives that token from a plain step and prefills the draft after
it, so the first token comes as fast as plain decoding's (with the 1.5B and its
0.5B draft the prefill had added 40-60% to it); the draft then sees the whole
context, so acceptance is what it was. `draft.model=self` (the self-test whose
every step accepts K) prefills before the first step as before.

`draft.context=W` (null: the whole prompt) prefills only the first `draft.sinks` tokens and the last W
(drafters/draft_window.py): on a long prompt with a short answer the draft's prefill of the whole prompt cost
more than drafting saved. `cached_len` still counts the whole context, so rollback is unchanged; the cache
is cut back to sinks + W once drafting grows it to sinks + 2W.

A chunked prefill (budget=auto's "chunked": `prefill_planned` with DraftPrefill kind "chunked") starts from an
empty cache: the step calls `catch_up` once per step, which feeds the next `chunk` context tokens, and the
prompt lookup alone drafts meanwhile; once the rest fits one chunk the model drafts again, its first forward
feeding the rest (as after plain steps). An answer that ends first leaves the rest unread.
"""

from __future__ import annotations

import weakref
from typing import Any

import mlx.core as mx

from specpipe.core.plan import DraftPrefill, StepPlan
from specpipe.core.protocols import DrafterBase, Rollback
from specpipe.core.stages.draft import Draft
from specpipe.costmodel.weights import weight_bytes
from specpipe.drafters.chain import ChainStop, chain, to_draft
from specpipe.drafters.cross_vocab import CrossVocab, choose_map
from specpipe.drafters.draft_vocab import DraftVocab, frequent_ids, head_module
from specpipe.drafters.draft_window import DraftWindow
from specpipe.drafters.ngram import MAX_N, NgramDrafter
from specpipe.engine import introspect
from specpipe.engine.engine import Capture, Engine, same_vocabulary
from specpipe.errors import SpecpipeError
from specpipe.prefix.snapshot import NotStorable, restore, take

# The rows a draft head scores by default: the 32k ids most used in code and English text (with the context's,
# added as they appear); Qwen's 152k-row head shrinks to a fifth (drafters/draft_vocab.py).
DEFAULT_VOCAB = 32768
# the unset lookup's shortest match on a request that read no prompt (draft.lookup_min_n=null): a 3-token
# repeat already followed the same way 91-93 % of the time in summaries of a 600-900-token document (the pair)
UNREAD_LOOKUP_MIN_N = 3

# What a loaded draft model's drafters share, computed once per (draft engine, target): the tokenizer check and
# the cut head's gathered rows. A server builds one drafter per request, and for Qwen2.5-Coder-0.5B these took
# ~1 s of every request's time to first token (tokenizer vocabularies read four times, 32k head rows gathered).
_SHARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _once(engine: Engine, target: Engine, key, build):
    """`build()`'s value for (engine, target, key), built on first use; both engines are held weakly."""
    per_target = _SHARED.setdefault(engine, weakref.WeakKeyDictionary())
    memo = per_target.setdefault(target, {})
    if key not in memo:
        memo[key] = build()
    return memo[key]


class ModelDrafter(DrafterBase):
    name = "model"
    engine: Engine  # always a model, never None
    cache: list  # always its own cache
    needs_hidden = False  # drafts from its own forwards, not the target's hidden states
    supports_trees = True  # its top-k chain (trees/drafting.py); through a token map, `intersection` only

    def __init__(
        self,
        target,
        load,
        model: str | None = None,
        path: str | None = None,
        quant: str | None = None,
        sampler=None,
        p_min: float = 0.0,
        lookup_min_n: int | None = None,
        vocab: int | None = None,
        vocab_map: str = "auto",
        context: int | None = None,
        sinks: int = 4,
    ):
        """
        Args:
            target: the target Engine (reused when model == "self").
            load: callable(name, path, precision, keys) -> Engine, from the runner (keys: the config keys for messages).
            model: packaged name, "self", or ignored when `path` is set; None needs `path`.
            path: GGUF file or model folder of the draft model.
            quant: draft weight precision; None = same as the target's config.
            sampler: specpipe.core.sampling.Sampler; None or temperature 0 drafts greedily.
            p_min: budget=confidence's floor: stop drafting below this top probability (0: never).
            lookup_min_n: draft by prompt lookup where at least this many context tokens match (0: never; None:
                only on a request whose prefill budget=auto skipped, matching UNREAD_LOOKUP_MIN_N tokens).
            vocab: the draft's LM head scores only the `vocab` most used ids plus the context's and the end
                ids (drafters/draft_vocab.py); 0: the whole vocabulary; None: DEFAULT_VOCAB where the
                draft's head can be cut, else the whole vocabulary.
            vocab_map: how a draft with another tokenizer drafts for the target (drafters/cross_vocab.py):
                auto | intersection | text; unused when the tokenizers are the same.
            context: the recent prompt tokens the draft prefills and keeps (drafters/draft_window.py); None: all.
            sinks: with `context`, the first tokens kept as well (attention sinks).
        """
        if lookup_min_n is not None and not 0 <= lookup_min_n <= MAX_N:
            raise SpecpipeError(
                f"draft.lookup_min_n={lookup_min_n} is out of range: 0 (no lookup) or 1..{MAX_N} (3 suits code edits)"
            )
        # longest match first, at least 4 tokens long when the floor allows: the n-gram drafter's default
        self.window = DraftWindow(context, sinks) if context is not None else None
        self.prefill_window = context  # budget=auto then chooses between this window and no prefill
        self._configured_window = self.window
        self._read_nothing = False  # budget=auto chose no prefill for this request: the lookup alone drafts
        self.catching_up = False  # a chunked prefill is behind the context (`catch_up`)
        self._chunk = 0  # ... by this many tokens a step
        self.prefill_tokens: int | None = None  # prompt tokens the last prefill or chunk fed the model
        self._lookup = NgramDrafter(min_n=lookup_min_n, max_n=max(4, lookup_min_n)) if lookup_min_n else None
        # a request that reads no prompt into the model (budget=auto's "none") still drafts from the prompt for
        # free: the lookup the user did not set is asked on such requests only, so every other step is as before
        unread = UNREAD_LOOKUP_MIN_N
        self._unread_lookup = NgramDrafter(min_n=unread, max_n=max(4, unread)) if lookup_min_n is None else None
        self.evidence_is_free = self._lookup is not None or self._unread_lookup is not None
        self.sampler = sampler
        self.p_min = p_min
        if model is None and not path:  # a composed config never gets here: preflight refuses it first
            from specpipe.config.preflight import NO_DRAFT_MODEL
            from specpipe.errors import ConfigError

            raise ConfigError(NO_DRAFT_MODEL)
        path_key = "draft.path"
        if not path and model and (model.endswith(".gguf") or "/" in model):
            path, path_key = model, "draft.model"  # draft.model=/path/to/file.gguf (or folder) works like draft.path
        self._cross: CrossVocab | None = None  # the token map of a draft with another tokenizer
        if model == "self" and not path:
            self.engine = target
        else:
            self.engine = load(name=None if path else model, path=path, precision=quant, keys=("draft.model", path_key))
            diff = _once(self.engine, target, "same_vocabulary", lambda: same_vocabulary(target, self.engine))
            if diff is not None:  # different tokenizers (or logit widths): draft through a token map
                chosen = _once(
                    self.engine,
                    target,
                    ("vocab_map", vocab_map),
                    lambda: choose_map(target, self.engine, vocab_map, diff),
                )
                self._cross = CrossVocab(target, self.engine, chosen, sampler)
        # a cut head (draft.vocab) ranks the draft's own ids; a mapped draft keeps its whole head
        self._vocab = self._shared_vocab(vocab, target) if self._cross is None else None
        # its prefill runs a model: the first token must not wait for it. Not draft.model=self, the self-test
        # whose every step accepts K (a plain first step would break that invariant)
        self.prefill_after_first_token = self.engine is not target
        if self._cross is not None:  # its cache counts its own tokens of the text: no snapshot by target ids
            self.prefix_notice = (
                f"draft.vocab_map={self._cross.method}: the draft model reads each prompt whole (its own tokens "
                "have no stored prefix); the target still reuses it"
            )
        self.plans_prefill = self.prefill_after_first_token
        self._vocab_seen = 0  # context ids whose rows the draft vocabulary has taken in
        self.cache = self.engine.make_cache()
        self.cached_len = 0
        self.forwards = 0
        self._rollback: Rollback | None = None  # the run's rollback strategy, for this drafter's own cache
        self._fed: list[int] | None = None  # ids fed into the cache since the strategy's before_forward

    @property
    def token_map(self) -> CrossVocab | None:
        """The map onto the target's tokens when the draft's tokenizer is another one, else None."""
        return self._cross

    def _shared_vocab(self, vocab: int | None, target) -> DraftVocab | None:
        """This drafter's own fork of the head cut every drafter on this draft engine shares (`_once`)."""
        key = ("draft_vocab", vocab, DEFAULT_VOCAB, tuple(sorted(target.eos_token_ids)))  # None: the default's
        shared = _once(self.engine, target, key, lambda: self._draft_vocab(vocab, target))
        return shared.fork() if shared is not None else None

    def _draft_vocab(self, vocab: int | None, target) -> DraftVocab | None:
        """The restricted head for draft.vocab (None: every row is scored)."""
        if vocab is None:  # the default: cut the head where it can be cut, quietly keep it elsewhere
            if self.engine is target:
                return None  # draft.model=self is a self-test (acceptance 1.0): the target's own head, whole
            try:
                return self._draft_vocab(DEFAULT_VOCAB, target)
            except SpecpipeError:
                return None
        if vocab == 0:
            return None
        setting = f"draft.vocab={vocab}"
        if vocab < 0:
            raise SpecpipeError(f"{setting} is out of range: 0 (the whole vocabulary) or a row count such as 32768")
        try:
            inner, _ = self.engine.hidden_parts()
        except SpecpipeError:
            raise SpecpipeError(
                f"{setting}: {self.engine.info.name} is not a llama-like model whose logits are its LM head over "
                "its hidden states, so its head cannot be cut; use draft.vocab=0"
            ) from None
        if introspect.logit_softcap(self.engine.model):
            # the cut head scores its rows with the bare LM head: a draft that squashes its logits (Gemma-2 / 4)
            # would draft from a sharper q than its own, exact but accepting less
            raise SpecpipeError(
                f"{setting}: {self.engine.info.name} soft-caps its logits, which a cut head does not; use draft.vocab=0"
            )
        head = head_module(self.engine.model, inner, setting)
        if vocab >= head.weight.shape[0]:
            return None
        tokenizer = self.engine.tokenizer
        return DraftVocab(head, frequent_ids(tokenizer, vocab), always=target.eos_token_ids, tokenizer=tokenizer)

    def draft_logits(self, ids: mx.array, capture: Capture | None) -> mx.array:
        """[1, vocab] float32 logits after feeding `ids` [n] into the draft cache: the last position's."""
        if self._vocab is None:
            logits = self.engine.forward(ids, self.cache, capture=capture).logits[-1:]
            if self._cross is not None and self._cross.method == "intersection":
                logits = logits + self._cross.vmap.mask  # q = 0 outside the tokens the target shares
            return logits
        states = capture.states if capture is not None else None
        hidden = self.engine.forward(ids, self.cache, capture=Capture(hidden=True, states=states)).hidden
        assert hidden is not None  # asked for with hidden=True
        return self._vocab.logits(hidden[-1:])  # the full head's logits stay lazy, never computed

    def use_rollback(self, strategy) -> None:
        """Roll this drafter's cache back with `strategy` (refused now if it cannot: SpecpipeError)."""
        strategy.check(self.cache, "draft")
        self._rollback = strategy

    def rollback(self, kept_len: int) -> int:
        """Keep the first `kept_len` context tokens in the cache; returns the positions dropped.

        Example: context of 10, k = 3 -> the cache holds 12 (context + 2 drafts);
        the target accepts 1 -> kept_len 11 -> 1 position dropped.
        """
        if self._cross is not None:  # kept_len counts the target's tokens: the draft's own tokens of that text
            kept_len = self._cross.draft_kept(kept_len, self.cached_len)
        drop = max(0, self.cached_len - kept_len)
        if self._fed is not None:  # a step that fed nothing has nothing to undo
            assert self._rollback is not None, "use_rollback() binds the strategy before the first step"
            self._rollback.rollback(self.cache, drop, engine=self.engine, fed_ids=self._fed)
            self._fed = None
        self.cached_len -= drop
        return drop

    def prefill(self, prompt_ids: list[int]) -> None:
        self.window, self._read_nothing, self.catching_up = self._configured_window, False, False
        self._prefill_request(prompt_ids)

    def _prefill_request(self, prompt_ids: list[int]) -> None:
        own = self._cross.prefill(prompt_ids) if self._cross is not None else prompt_ids  # in the draft's tokens
        self._prefill_own(own[:-1])
        self._read_rest(prompt_ids)

    def prefix_state(self, context_ids: list[int], length: int) -> Any:
        """A copy of the draft cache over the context's first min(length, cached) positions (the prefix store
        keeps it with the target's); None for a draft with another tokenizer (its positions count its own
        tokens: it prefills itself again), a windowed or skipped prefill (its cache is not the prefix's) or a
        cache kind the store cannot copy."""
        n = min(length, self.cached_len)
        if self._cross is not None or self.cache is None or n < 1 or self.window is not None or self._read_nothing:
            return None
        try:
            return take(self.cache, n)
        except NotStorable:
            return None

    def resume(self, prompt_ids: list[int], state: Any) -> None:
        """prefill from a draft snapshot of the prompt's first `state.length` positions (a whole-prompt prefill's,
        see prefix_state): the rest only is fed."""
        self.window, self._read_nothing, self.catching_up = None, False, False
        self.cache = restore(state, self.engine.make_cache())
        self.prefill_tokens = max(0, len(prompt_ids) - 1 - state.length)
        if self.prefill_tokens:
            self.engine.prefill(prompt_ids[state.length : -1], self.cache)
        self.cached_len = len(prompt_ids) - 1
        self._fed = None
        self._read_rest(prompt_ids)

    def _read_rest(self, prompt_ids: list[int]) -> None:
        """What reads the prompt beside the draft cache: the draft vocabulary's rows, the prompt lookup."""
        if self._vocab is not None:
            self._vocab.reset(prompt_ids)
            self._vocab_seen = len(prompt_ids)
        for lookup in (self._lookup, self._unread_lookup):
            if lookup is not None:
                lookup.prefill(prompt_ids)

    def prefill_planned(self, prompt_ids: list[int], prefill: DraftPrefill | None) -> None:
        """The deferred prefill as budget=auto chose it: the whole prompt, sinks + a window, nothing (the
        lookup alone drafts; the model is asked for nothing this request) or the whole prompt a chunk per step
        (`catch_up`; a draft with another tokenizer, whose cache counts its own tokens, reads it whole at
        once); None: as configured."""
        kind = prefill.kind if prefill is not None else ""
        self.window = self._configured_window
        if prefill is not None and kind == "window":
            self.window = DraftWindow(prefill.window, prefill.sinks)
        elif kind in ("full", "chunked"):
            self.window = None
        self._read_nothing = kind == "none"
        self.catching_up = kind == "chunked" and self._cross is None
        if prefill is not None and self.catching_up:
            self._chunk = max(1, prefill.chunk)
            self._prefill_own([])  # an empty cache the chunks fill
            self._read_rest(prompt_ids)
            return
        self._prefill_request(prompt_ids)

    def catch_up(self, context_ids: list[int]) -> int:
        """Feed the next chunk of a chunked prefill; returns its tokens (0 once the rest, at most a chunk, is
        left to the model's next draft, whose first forward feeds it)."""
        if not self.catching_up:
            return 0
        start = self.cached_len
        if len(context_ids) - 1 - start <= self._chunk:
            self.catching_up = False
            return 0
        self.engine.prefill(context_ids[start : start + self._chunk], self.cache)
        self.cached_len = start + self._chunk
        self.prefill_tokens = self._chunk
        return self._chunk

    def _prefill_own(self, ids: list[int]) -> None:
        """A fresh draft cache standing for the context `ids` (its own tokens): all of them, or the window's."""
        self.cache = self.engine.make_cache()  # each generation starts clean
        if self._read_nothing:  # the model drafts nothing this request: a later prefill_planned starts it anew
            ids = []
        fed = self.window.prefill_ids(ids) if self.window is not None else ids
        self.engine.prefill(fed, self.cache)
        self.cached_len, self.prefill_tokens = len(ids), len(fed)
        self._fed = None

    def propose(self, context_ids: list[int], plan: StepPlan) -> Draft:
        k = plan.k
        lookup = self._asked_lookup()
        if lookup is not None:
            # auto: up to k_max (plan.lookup_k), free; a fixed budget's K caps it (lookup_k 0)
            draft = lookup.propose(context_ids, StepPlan(k=max(k, plan.lookup_k)))
            self.last_evidence = lookup.last_evidence
            if draft.token_ids:
                self.last_tops = []  # no chain ran: nothing for the chain stop's hold rates
                return draft
        if k <= 0:
            return Draft(token_ids=[])
        if self._cross is not None:  # the draft drafts in its own tokens; the pipeline gets the target's ids
            own = self._cross.own_ids(context_ids, self.cached_len)
            if own is None:
                return Draft(token_ids=[])
            drafted = self.propose_own(own, k, self._cross.sampler, plan.chain_stop)
            return self._cross.to_target(drafted, context_ids, k)
        return self.propose_own(context_ids, k, self.sampler, plan.chain_stop)

    def _asked_lookup(self) -> NgramDrafter | None:
        """The prompt lookup this step asks first: the configured one, or on a request that read no prompt the
        one the user left unset."""
        return self._lookup or (self._unread_lookup if self._read_nothing else None)

    def propose_own(self, context_ids: list[int], k: int, sampler, stop: ChainStop | None = None) -> Draft:
        """Draft k tokens after `context_ids` in this model's own ids (from `sampler`'s q; None: greedy),
        stopping where `stop` says (budget=auto's rule; None: all k)."""
        self.take_in(context_ids)
        capture = self.rollback_capture()
        start = self.cached_len
        # Feed what the draft cache has not seen yet (at least the last token) in
        # the first drafting forward: a catch-up over accepted tokens costs no
        # forward of its own. Then chain k - 1 more steps on the drafted tokens.
        fed = 0

        def next_logits(i: int, y):
            nonlocal fed
            ids = mx.array(context_ids[start:], dtype=mx.uint32) if i == 0 else y
            fed += len(context_ids) - start if i == 0 else 1
            self.forwards += 1
            return self.draft_logits(ids, capture)

        self.last_tops = []
        tokens, q_rows = chain(next_logits, k, sampler, self.p_min, stop, self.last_tops)
        draft = to_draft(
            tokens, q_rows, catchup_tokens=len(context_ids) - start - 1
        )  # accepted tokens fed beside the newest one
        self.note_fed(context_ids, start, draft.token_ids, fed)
        return draft

    def take_in(self, context_ids: list[int]) -> None:
        """Before a draft: cut a grown window back (draft.context) and let the draft propose what the target
        has emitted since the last draft (draft.vocab). A chunked prefill still behind is caught up by this
        draft's first forward."""
        self.catching_up = False
        if self.window is not None and self.window.due(self.cached_len):
            self._prefill_own(context_ids[: self.cached_len])
        if self._vocab is not None:
            self._vocab.add(context_ids[self._vocab_seen :])
            self._vocab_seen = len(context_ids)

    @property
    def vocab_map(self) -> str:  # type: ignore[override]  # DrafterBase's plain "", computed here
        """The token map a draft with another tokenizer drafts through ("": the target's own tokenizer)."""
        return self._cross.method if self._cross is not None else ""

    @property
    def vocab_shared(self) -> int | None:  # type: ignore[override]  # DrafterBase's plain None, computed here
        """Target ids the draft can reach through the map (None: no map)."""
        return self._cross.shared if self._cross is not None else None

    @property
    def head_rows(self) -> int | None:  # type: ignore[override]  # DrafterBase's plain None, computed here
        """The rows the draft head scores whatever the context (None: every row)."""
        return self._vocab.base_rows if self._vocab is not None else None

    @property
    def bytes_share(self) -> float:  # type: ignore[override]  # DrafterBase's plain 1.0, computed here
        """The share of a full forward's weight bytes a drafted token reads (< 1 with draft.vocab)."""
        return self._vocab.bytes_share(weight_bytes(self.engine.model)) if self._vocab is not None else 1.0

    def rollback_capture(self) -> Capture | None:
        """Tell the rollback strategy a forward on this drafter's cache may be partly undone; what to record."""
        states = self._rollback.before_forward(self.cache) if self._rollback is not None else None
        return Capture(states=states) if states is not None else None

    def note_fed(self, context_ids: list[int], start: int, drafted: list[int], fed: int) -> None:
        """`fed` ids went into the cache from context position `start` on (the context's tail, then `drafted`)."""
        self.cached_len = start + fed
        self._fed = (context_ids[start:] + drafted)[:fed]  # only the short tail: no copy of the whole context

    def propose_tree(self, context_ids: list[int], shape):
        """A greedy chain with its top-k siblings at each depth (tree != chain; specpipe/trees/); with the
        prompt lookup on, the trie of earlier matches' continuations where the context's tail matched."""
        from specpipe.trees.drafting import TreeDraft, model_candidates
        from specpipe.trees.tree import TokenTree

        lookup = self._asked_lookup()
        if lookup is not None:
            tree = lookup.propose_tree(context_ids, shape)
            if tree.candidates.tokens:
                return tree
        if self._cross is not None:  # the draft's tree in its own tokens, moved onto the target's ids
            own = self._cross.own_ids(context_ids, self.cached_len)
            if own is None:
                return TreeDraft(TokenTree())
            return self._cross.tree_to_target(model_candidates(self, own, shape.max_depth, shape.width))
        return model_candidates(self, context_ids, shape.max_depth, shape.width)
