"""budget=auto's price of a draft model's prefill: read the whole prompt, a window of it, or none of it.

Contract: `choose_prefill(PrefillPrices) -> DraftPrefill` weighs, in target steps (one plain step = 1), what
each way of preparing the draft saves over the expected answer against what its prefill costs, and returns
the best with every option's predicted net figure (the budget logs them). It reads only the numbers it is
given: no drafter, no timing, no rates object.

- full: the draft reads the prompt; saves `tokens x saving`, costs `prefill x prompt_len`.
- window: the draft reads sinks + the last W tokens (drafters/draft_window.py); keeps `window_keeps` of the
  saving (acceptance falls as the draft sees less), costs `prefill x (sinks + W)`.
- none: no draft-model prefill at all: only what is free drafts (a prompt lookup beside the model,
  `free_saving` per token; 0 without one, i.e. plain decoding).

Worked example (prefill 0.1 step per prompt token, saving 0.3 per answer token, window keeps 0.9, sinks 4,
W 256): an 800-token prompt with a 32-token answer: full 9.6 - 80 = -70.4, window 8.64 - 26 = -17.4, none 0:
none. The same prompt with a 1000-token answer: full 300 - 80 = 220, window 270 - 26 = 244: window.
"""

from __future__ import annotations

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


def choose_prefill(p: PrefillPrices) -> DraftPrefill:
    """The option with the best predicted net saving (ties go to the one that prefills less)."""
    saving, free = max(0.0, p.saving), max(0.0, p.free_saving)
    nets: dict[str, float] = {"none": p.tokens * free}
    if p.window > 0 and p.prompt_len > p.sinks + p.window:
        nets["window"] = p.tokens * max(free, saving * p.window_keeps) - p.prefill * (p.sinks + p.window)
    if p.full:
        nets["full"] = p.tokens * max(free, saving) - p.prefill * p.prompt_len
    order = ["none", "window", "full"]  # by what each prefills: the cheaper wins a tie
    kind = max((k for k in order if k in nets), key=lambda k: (round(nets[k], 6), -order.index(k)))
    return DraftPrefill(
        kind=kind,
        window=p.window if kind == "window" else 0,
        sinks=p.sinks,
        tokens=round(p.tokens, 1),
        net={k: round(v, 2) for k, v in nets.items()},
    )
