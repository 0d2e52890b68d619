"""budget=auto's price of a draft model's prefill: read the whole prompt, a window of it, none of it, or the
whole of it in chunks between target steps while the free drafters draft.

Contract: `choose_prefill(PrefillPrices) -> DraftPrefill` weighs, in target steps (one plain step = 1), what
each way of preparing the draft saves over the expected answer against what its prefill costs, and returns
the best with every option's predicted net figure (the budget logs them). It reads only the numbers it is
given: no drafter, no timing, no rates object. Each option is priced over the earlier answers' lengths
(`answers`, the request's own sample) where there are some, else over the one expected length `tokens`.

- full: the draft reads the prompt; saves `T x saving`, costs `prefill x prompt_len`.
- window: the draft reads sinks + the last W tokens (drafters/draft_window.py); keeps `window_keeps` of the
  saving (acceptance falls as the draft sees less), costs `prefill x (sinks + W)`.
- none: no draft-model prefill at all: only what is free drafts (a prompt lookup beside the model,
  `free_saving` per token; 0 without one, i.e. plain decoding).
- chunked: the draft reads the whole prompt `chunk` tokens per step while the free drafters draft; an answer
  that ends before it caught up pays only the chunks it ran. Linear in T, full and none price any spread of
  answer lengths by its mean; chunked pays where answers are either shorter than its catch-up or long, so it is
  chosen only on such a sample (never on one expected length, where full or none always does as well).

Worked example (prefill 0.1 step per prompt token, saving 0.3 per answer token, window keeps 0.9, sinks 4,
W 256): an 800-token prompt with a 32-token answer: full 9.6 - 80 = -70.4, window 8.64 - 26 = -17.4, none 0:
none. The same prompt with a 1000-token answer: full 300 - 80 = 220, window 270 - 26 = 244: window.
Chunked (prefill 0.02, saving 0.3, 64 tokens a step, no window): earlier answers of 5 and 200 tokens: full
0.3 x 102.5 - 16 = 14.75; chunked catches up in 13 steps: the 5-token answer pays 5 chunks (-6.4), the
200-token one 16 for 187 model-drafted tokens (+40.1): mean +16.85: chunked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specpipe.core.plan import DraftPrefill


@dataclass(frozen=True)
class PrefillPrices:
    """What the budget knows of one request before its draft prefills, in target steps.

    prompt_len: the prompt's tokens (the draft's full prefill reads all but the newest).
    tokens: the answer tokens still expected (max_tokens, cut to earlier answers' length).
    prefill: the draft's prefill cost per prompt token, in target steps.
    saving: target steps a model-drafted answer saves per token (1 - 1 / expected speed-up; 0 when it loses).
    free_saving: the same for the free drafters alone (a prompt lookup beside the model; 0: none).
    window, sinks: the window option's size (0: no window option, e.g. the user fixed draft.context).
    window_keeps: the share of `saving` a windowed draft keeps.
    full: whether reading the whole prompt is an option (False where the user capped it with draft.context).
    chunk: the chunked option's prompt tokens prefilled per step (0: no chunked option).
    answers: earlier answers' lengths, each cut to this request's room (empty: `tokens` alone).
    """

    prompt_len: int
    tokens: float
    prefill: float
    saving: float
    free_saving: float = 0.0
    window: int = 0
    sinks: int = 4
    window_keeps: float = 1.0
    full: bool = True
    chunk: int = 0
    answers: tuple[float, ...] = ()


KINDS = ("none", "window", "chunked", "full")  # by what each prefills: the cheaper wins a tie


def choose_prefill(p: PrefillPrices, fixed: str | None = None) -> DraftPrefill:
    """The option with the best predicted net saving (ties go to the one that prefills less); `fixed`: the
    user's choice (budget.draft_prefill), taken where the request offers it (a window of a prompt it covers, or
    chunks of a prompt shorter than one, is not: the best of the others), every option still priced for the log."""
    saving, free = max(0.0, p.saving), max(0.0, p.free_saving)
    lengths = p.answers or (p.tokens,)
    mean = sum(lengths) / len(lengths)
    nets: dict[str, float] = {"none": mean * free}
    if p.window > 0 and p.prompt_len > p.sinks + p.window:
        nets["window"] = mean * max(free, saving * p.window_keeps) - p.prefill * (p.sinks + p.window)
    if p.full and p.chunk > 0 and p.prompt_len > p.chunk:
        nets["chunked"] = sum(_chunked_net(p, t, free, max(free, saving)) for t in lengths) / len(lengths)
    if p.full:
        nets["full"] = mean * max(free, saving) - p.prefill * p.prompt_len
    kind = max((k for k in KINDS if k in nets), key=lambda k: (round(nets[k], 6), -KINDS.index(k)))
    if fixed in nets:
        kind = fixed
    return DraftPrefill(
        kind=kind,
        window=p.window if kind == "window" else 0,
        sinks=p.sinks,
        chunk=p.chunk if kind == "chunked" else 0,
        tokens=round(mean, 1),
        net={k: round(v, 2) for k, v in nets.items()},
    )


def _chunked_net(p: PrefillPrices, answer: float, free: float, best: float) -> float:
    """The chunked option's net saving on an answer of `answer` tokens: the free drafters' saving while the
    draft catches up (`chunk` prompt tokens a step, 1 / (1 - free) answer tokens a step), the model's after;
    the prefill paid is the chunks run before the answer ended."""
    per_step = 1.0 / (1.0 - free) if free < 1.0 else 1.0
    steps = math.ceil(p.prompt_len / p.chunk)  # to catch up on the prompt
    ran = min(float(steps), answer / per_step)  # chunks run before the answer ended (or all of them)
    caught_up_at = ran * per_step  # answer tokens emitted while catching up
    return free * caught_up_at + best * (answer - caught_up_at) - p.prefill * min(p.prompt_len, p.chunk * ran)
