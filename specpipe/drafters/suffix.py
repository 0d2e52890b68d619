"""`draft=suffix`: draft from everything already said. The current request's context and a bounded store
of earlier prompts and answers (the chat's turns, the server's requests) are one n-gram trie with follower
counts (suffix_store.py); a draft follows the most frequent branch from the longest match. No model.

Worked example (max_n=4): an earlier answer was [10, 11, 12, 13, 14] and this request's context ends in
[11, 12]. The store's longest match is (11, 12), followed by 13 once: draft 13; then (11, 12, 13) -> 14.
The draft stops at `plan.k`, at `spec_factor` x the first match's length (a short match earns a short
draft, as SuffixDecoding's max_spec_factor), where the path's estimated probability (the product of
each chosen follower's share of its node's count) falls below `min_prob`, or where only a match shorter
than the first one is left.

Each draft names where it came from (`Draft.source`, counted per answer in RunStats.drafted_by_source /
accepted_by_source, shown by the TUI, the summary line and the server's `specpipe` field): "context" where this
request's own text holds the match followed by the draft's first token (prompt lookup would have found it),
"history" where only earlier requests do.

`last_evidence` is the class budget=auto keeps acceptance rates by: 3 x the match length's bucket
(1, 2, 3, 4-7, 8-15, 16+) plus the first token's share bucket (< 1/2, < 9/10, above). Proposals are
point masses (`probs` None): exact under sampling, as n-gram's. Each request is one sequence of the store
from its prefill on, so it is also matched against itself (prompt lookup) and stays in the store as
history when the request ends; `draft.store_tokens` bounds the store (least recently used requests
leave first); `draft.store_file` keeps it across processes (suffix_file.py: JSON of token ids, read as
data only). A Session gives all its drafters one shelf of stores (`history`), so a chat's turns and a
server's requests share one history; a new Session starts empty.
"""

from __future__ import annotations

from specpipe.core.plan import StepPlan
from specpipe.core.protocols import DrafterBase
from specpipe.core.stages.draft import Draft
from specpipe.drafters.suffix_file import read_store_file, write_store_file
from specpipe.drafters.suffix_store import HistoryShelf, SuffixStore
from specpipe.errors import SpecpipeError

MAX_N = 64  # the trie's deepest level: each appended token updates max_n nodes
LENGTH_BUCKETS = (1, 2, 3, 4, 8, 16)  # a match of at least LENGTH_BUCKETS[i] tokens is in bucket i
SHARE_BUCKETS = (0.5, 0.9)  # a first-token share of at least SHARE_BUCKETS[i] is in bucket i + 1
HISTORY, CONTEXT = "history", "context"  # Draft.source: where the draft's first token followed its match


def evidence_class(match_n: int, share: float) -> int:
    """The budget's class for a draft from a match of `match_n` tokens whose first token had `share` of
    its node's count, e.g. (5, 1.0) -> 3 * 3 + 2 = 11."""
    length = sum(match_n >= b for b in LENGTH_BUCKETS) - 1
    return 3 * length + sum(share >= b for b in SHARE_BUCKETS)


class SuffixDrafter(DrafterBase):
    name = "suffix"
    supports_hindsight = True

    def __init__(
        self,
        min_n: int = 1,
        max_n: int = 16,
        spec_factor: float = 2.0,
        min_prob: float = 0.1,
        store_tokens: int = 200_000,
        store_file: str | None = None,
        history: HistoryShelf | None = None,
        target=None,
    ):
        if not 1 <= min_n <= max_n <= MAX_N:
            raise SpecpipeError(
                f"draft.min_n={min_n}, draft.max_n={max_n}: need 1 <= min_n <= max_n <= {MAX_N} (e.g. draft.max_n=16)"
            )
        if spec_factor <= 0 or not 0.0 <= min_prob <= 1.0:
            raise SpecpipeError(
                f"draft.spec_factor={spec_factor}, draft.min_prob={min_prob}: need spec_factor > 0 and "
                "0 <= min_prob <= 1 (e.g. draft.spec_factor=2.0 draft.min_prob=0.1)"
            )
        if store_tokens < 0:
            raise SpecpipeError(f"draft.store_tokens={store_tokens}: need >= 0 (0 keeps no earlier requests)")
        self.min_n, self.max_n, self.spec_factor, self.min_prob = min_n, max_n, spec_factor, min_prob
        shelf = history if history is not None else HistoryShelf()  # alone (a test, a script): its own store
        # the file's history is only good for the model whose tokenizer wrote it
        info = target.info if target is not None else None
        self._model = f"{info.name} {info.sha256}" if info is not None else ""
        self.store_file = store_file
        earlier = read_store_file(store_file, self._model) if store_file else None
        self.store: SuffixStore = shelf.store(store_tokens, min_n, max_n, earlier)
        self._seq: int | None = None  # this request's sequence in the store
        self._match: list[int] = []  # the last lookup's matched suffix

    def prefill(self, prompt_ids: list[int]) -> None:
        """A new request: a new sequence of the store (the previous request's stays, as history); with a
        store file, the history so far is written first (one whole-file write per request)."""
        if self._seq is not None and self.store.holds(self._seq) and not self.store.length(self._seq):
            self.store.close(self._seq)
        if self.store_file:
            write_store_file(self.store_file, self._model, self.store.sequences_ids())
        self._seq = self.store.open()
        self.store.append(self._seq, list(prompt_ids))

    def propose(self, context_ids: list[int], plan: StepPlan) -> Draft:
        self._sync(context_ids)
        ids, self.last_evidence = self._lookup(context_ids, plan.k)
        source = "" if not ids else CONTEXT if _followed_in(context_ids, self._match, ids[0]) else HISTORY
        return Draft(token_ids=ids, source=source)

    def hindsight(self, context_ids: list[int], m: int) -> list[int]:
        """What propose would have said before the last m tokens: this request's sequence is cut back to
        context_ids[:-m] first, so the answer is not its own evidence (the next propose re-appends them)."""
        self._sync(context_ids[: len(context_ids) - m])
        ids, self.last_evidence = self._lookup(context_ids[: len(context_ids) - m], m)
        return ids

    def _sync(self, context_ids: list[int]) -> None:
        """Bring this request's sequence to `context_ids`: only its new tail is added; a shorter context (a
        rollback, a hindsight look) is truncated; a sequence the store evicted is opened again."""
        if self._seq is None or not self.store.holds(self._seq):
            self._seq = self.store.open()
        have = self.store.length(self._seq)
        if len(context_ids) < have:
            self.store.truncate(self._seq, len(context_ids))
            have = len(context_ids)
        if len(context_ids) > have:
            self.store.append(self._seq, list(context_ids[have:]))
        else:
            self.store.touch(self._seq)

    def _lookup(self, context_ids: list[int], k: int) -> tuple[list[int], int | None]:
        """Up to k ids along the most frequent branch after the context's longest match, and the draft's
        evidence class (None when nothing matched)."""
        if k <= 0:
            return [], None
        pattern = list(context_ids[-self.max_n :])
        first = self.store.followers(pattern)
        if first is None:
            return [], None
        match_n, node = first
        self._match = pattern[len(pattern) - match_n :]
        token, count = node.best()
        share = count / node.total
        if share < self.min_prob:
            return [], None
        limit = min(k, max(1, int(self.spec_factor * match_n)))
        draft, prob = [token], share
        while len(draft) < limit:
            pattern = (pattern + [token])[-self.max_n :]
            found = self.store.followers(pattern, shortest=match_n)  # never a shorter match than the first
            if found is None:
                break
            _, node = found
            token, count = node.best()
            prob *= count / node.total
            if prob < self.min_prob:
                break
            draft.append(token)
        return draft, evidence_class(match_n, share)


def _followed_in(context_ids: list[int], gram: list[int], token: int) -> bool:
    """Whether `gram` followed by `token` occurs in this request's own context (before its last token), i.e.
    prompt lookup alone would have found the draft's first token; otherwise only earlier requests held it.

    Example: context [4, 5, 6, 4, 5], gram [4, 5]: token 6 -> True (positions 0-2), token 7 -> False.
    """
    if not gram:
        return False
    n, first = len(gram), gram[0]
    end = len(context_ids) - n  # the gram must have a follower inside the context
    i = 0
    while i < end:
        try:
            i = context_ids.index(first, i, end)
        except ValueError:
            return False
        if context_ids[i + n] == token and context_ids[i : i + n] == gram:
            return True
        i += 1
    return False
