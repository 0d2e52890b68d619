"""An answer's figures in the shapes other servers give them, so front-ends written for those read specpipe's.

Contract: `llama_timings(stats)` is llama-server's `timings` object (tools/server/README.md of llama.cpp:
cache_n, prompt_n, prompt_ms, prompt_per_token_ms, prompt_per_second, predicted_n, predicted_ms,
predicted_per_token_ms, predicted_per_second, and for a speculative run draft_n / draft_n_accepted);
`DraftTally` counts one answer's drafts from its Verified events and `speculative_decoding()` gives
vLLM's per-request summary of them (its SpecDecodingStats counts plus the derived mean acceptance length,
acceptance rate and acceptance by position). Both sit beside the `specpipe` field; nothing here runs a model.
"""

from __future__ import annotations

from specpipe.events import RunStats, Verified


def llama_timings(stats: RunStats) -> dict:
    """llama-server's `timings` for one answer. `cache_n`: prompt tokens taken from the prefix store; the
    prompt side is the prefill of the rest (`prompt_n`: the tokens actually prefilled, as llama-server counts
    them beside its own cache); the predicted side is every generated token over the time from the
    prefill's end to the last token."""
    prompt_ms = 1000.0 * stats.prefill_s
    predicted_ms = 1000.0 * max(0.0, stats.wall_s - stats.prefill_s)
    n, p = stats.generated_tokens, stats.prompt_tokens - stats.cached_tokens
    return {
        "cache_n": stats.cached_tokens,
        "prompt_n": p,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / p if p else 0.0,
        "prompt_per_second": 1000.0 * p / prompt_ms if prompt_ms else 0.0,
        "predicted_n": n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / n if n else 0.0,
        "predicted_per_second": 1000.0 * n / predicted_ms if predicted_ms else 0.0,
        "draft_n": stats.drafted,
        "draft_n_accepted": stats.accepted,
    }


class DraftTally:
    """Drafts, drafted and accepted tokens, and accepted tokens per draft position, over one answer's steps.

    Example: steps drafting [a, b, c] (a, b kept) then [d, e] (none kept) -> num_drafts 2, num_draft_tokens 5,
    num_accepted_tokens 2, accepted per position [1, 1, 0], drafted per position [2, 2, 1].
    """

    def __init__(self) -> None:
        self.drafts = 0
        self.drafted = 0
        self.accepted = 0
        self.accepted_at: list[int] = []
        self.drafted_at: list[int] = []

    def count(self, event: Verified) -> None:
        k = len(event.accepted_ids) + len(event.rejected_ids)
        if k == 0:  # a plain step drafted nothing
            return
        depth = event.tree_depth or k  # a tree's positions are its depths, as metrics.py counts them
        n = len(event.accepted_ids)
        self.drafts += 1
        self.drafted += k
        self.accepted += n
        grow = depth - len(self.drafted_at)
        if grow > 0:
            self.drafted_at += [0] * grow
            self.accepted_at += [0] * grow
        for i in range(depth):
            self.drafted_at[i] += 1
        for i in range(min(n, depth)):
            self.accepted_at[i] += 1

    def speculative_decoding(self) -> dict:
        """vLLM's per-request summary: counts, mean acceptance length (1 + accepted / drafts: the bonus
        counted), acceptance rate (accepted / drafted), acceptance rate at each draft position."""
        return {
            "num_drafts": self.drafts,
            "num_draft_tokens": self.drafted,
            "num_accepted_tokens": self.accepted,
            "num_accepted_tokens_per_pos": list(self.accepted_at),
            "mean_acceptance_length": 1.0 + self.accepted / self.drafts if self.drafts else 1.0,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "acceptance_rate_per_pos": [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)],
        }
