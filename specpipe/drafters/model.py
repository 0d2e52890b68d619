"""`draft=model`: a smaller model of the same tokenizer drafts greedily.

`draft.model=self` drafts with the target's own weights (separate cache):
a self-test whose greedy acceptance must be 1.0. The draft cache holds the
context plus the first k-1 drafted tokens after `propose`; the rollback
stage trims what the target rejected.
"""

from __future__ import annotations

import mlx.core as mx

from specpipe.engine.engine import same_vocabulary
from specpipe.errors import SpecpipeError
from specpipe.stages.draft import Draft


class ModelDrafter:
    name = "model"

    def __init__(
        self, target, load, model: str = "self", path: str | None = None, quant: str | None = None, sampler=None, **_runtime
    ):
        """
        Args:
            target: the target Engine (reused when model == "self").
            load: callable(name, path, precision) -> Engine, from the runner.
            model: packaged name, "self", or ignored when `path` is set.
            path: GGUF file or model folder of the draft model.
            quant: draft weight precision; None = same as the target's config.
            sampler: specpipe.sampling.Sampler; None or temperature 0 drafts greedily.
        """
        self.sampler = sampler
        self.p_min = 0.0  # budget=confidence: stop drafting below this top probability
        if not path and (model.endswith(".gguf") or "/" in model):
            path = model  # draft.model=/path/to/file.gguf (or folder) works like draft.path
        if model == "self" and not path:
            self.engine = target
        else:
            self.engine = load(name=None if path else model, path=path, precision=quant)
            diff = same_vocabulary(target, self.engine)
            if diff is not None:
                raise SpecpipeError(
                    f"draft model {self.engine.info.name} and target {target.info.name} have different "
                    f"tokenizers ({diff}): pick a draft model of the same family, or draft=ngram"
                )
        self.cache = self.engine.make_cache()
        self.cached_len = 0
        self.forwards = 0

    def prefill(self, prompt_ids: list[int]) -> None:
        self.cache = self.engine.make_cache()  # each generation starts clean
        self.engine.prefill(prompt_ids[:-1], self.cache)
        self.cached_len = len(prompt_ids) - 1

    def propose(self, context_ids: list[int], k: int) -> Draft:
        if k <= 0:
            return Draft(token_ids=[])
        # Feed what the draft cache has not seen yet (at least the last token) in
        # the first drafting forward: a catch-up over accepted tokens costs no
        # forward of its own. Then chain k - 1 more greedy steps. The graph is built lazily and evaluated
        # once at the end: no host round trip per drafted token.
        # With a confidence floor each token is checked on the host before the next.
        y = mx.array(context_ids[self.cached_len :], dtype=mx.uint32)
        fed = len(context_ids) - self.cached_len
        sampled = self.sampler is not None and not self.sampler.greedy
        tokens, q_rows = [], []
        for i in range(k):
            logits = self.engine.forward(y, self.cache)[-1:]
            self.forwards += 1
            fed += i > 0  # this forward fed the previous draft token
            if sampled:
                # q is built exactly as the comparator builds p (same processing)
                q = self.sampler.probs(logits)
                y = self.sampler.sample(q)
            else:
                q = None
                y = mx.argmax(logits, axis=-1).astype(mx.uint32)
            if self.p_min > 0:
                top = mx.max(q if q is not None else mx.softmax(logits, axis=-1)).item()
                if top < self.p_min:
                    break  # unsure: stop here rather than spend a verify slot on a likely reject
            tokens.append(y)
            if q is not None:
                q_rows.append(q)
        catchup = len(context_ids) - self.cached_len - 1  # accepted tokens fed beside the newest one
        self.cached_len += fed
        if not tokens:
            return Draft(token_ids=[], catchup_tokens=catchup)
        draft_ids = mx.concatenate(tokens).tolist()
        return Draft(token_ids=draft_ids, probs=mx.concatenate(q_rows) if sampled else None, catchup_tokens=catchup)

    def propose_tree(self, context_ids: list[int], shape):
        """A greedy chain with its top-k siblings at each depth (tree != chain; specpipe/trees/)."""
        from specpipe.trees.drafting import model_candidates

        return model_candidates(self, context_ids, shape.max_depth, shape.width)
