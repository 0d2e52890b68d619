"""`draft=chain`: drafters asked in order until one proposes, each priced by its own cost and acceptance.

Greedy output must equal the target decoding alone (draft=none) whichever source drafts each step, with
trim and checkpoint rollback, under a fixed K and budget=auto; a source that never proposes hands every
step to the next; a source that does not pay is skipped (a plain step when none does); sampling through
the chain hands the comparator the proposing source's own q; a bad source list is one line at preflight.
"""

from __future__ import annotations

import mlx.core as mx
import msgspec
import pytest
from conftest import CONF_DIR, first_difference, noisy_copy, prepared, run_module, tiny
from hydra import compose, initialize_config_dir

import specpipe.config.schema  # noqa: F401  (the schemas and the resolvers compose needs)
from specpipe.budgets.auto import AutoBudget
from specpipe.budgets.fixed import FixedBudget
from specpipe.config.config_groups import group_option
from specpipe.config.preflight import check_config
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.plan import StepPlan
from specpipe.core.sampling import Sampler
from specpipe.core.stages.bonus import GreedyBonus, SampledBonus
from specpipe.core.stages.compare import GreedyComparator, RejectionComparator
from specpipe.drafters.model import ModelDrafter
from specpipe.drafters.none import NoneDrafter
from specpipe.drafters.sources import ChainDrafter, check_sources
from specpipe.events import Drafted, Event, RunFinished
from specpipe.rollbacks.checkpoint import CheckpointRollback
from specpipe.rollbacks.trim import TrimRollback

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n"
MAX_TOKENS = 40


def chain(target, draft, sources, probe_every=1, sampler=None, **keys):
    """A ChainDrafter as conf/draft/chain.yaml builds it; `keys`: {source: {key: value}} overrides."""
    names = ("ngram", "model", "layerskip", "mtp", "lookahead", "eagle3", "suffix")
    nodes = {n: group_option("draft", n) for n in names}
    nodes["model"]["model"] = "other"  # the noisy copy, through `load`
    nodes["layerskip"]["depth"] = 1
    for name, values in keys.items():
        nodes[name].update(values)
    return ChainDrafter(
        target=target, load=lambda **_: draft, sources=sources, probe_every=probe_every, sampler=sampler, **nodes
    )


def run(target, drafter, budget, prompt, rollback=None, comparator=None, bonus=None, max_tokens=MAX_TOKENS):
    pipe = SpeculativePipeline(
        target, drafter, budget, comparator or GreedyComparator(), rollback or TrimRollback(), bonus or GreedyBonus()
    )
    events: list[Event] = list(pipe.run(prompt, max_tokens, stop_ids=set()))
    final = events[-1]
    assert isinstance(final, RunFinished)
    return final, [e for e in events if isinstance(e, Drafted) and e.draft_ids]


@pytest.fixture(scope="module", params=["llama", "qwen3_next"])
def pair(request):
    """A tiny target (attention-only, or a hybrid whose recurrent layers need checkpoint rollback), a noisy
    copy to draft with, the repetitive prompt and the target's own greedy tokens (draft=none)."""
    target = tiny(request.param)
    draft = noisy_copy(target, scale=0.5)
    prompt = target.encode_prompt(PROMPT, chat=False)
    rollback = TrimRollback if request.param == "llama" else CheckpointRollback
    baseline, _ = run(target, NoneDrafter(), FixedBudget(k=1), prompt, rollback())
    return target, draft, prompt, baseline.token_ids, rollback


# ---------------------------------------------------------------- lossless, whichever source drafts


@pytest.mark.parametrize("budget", ["fixed", "auto"])
@pytest.mark.parametrize("second", ["model", "layerskip"])
def test_greedy_chain_equals_target_alone(pair, second, budget):
    target, draft, prompt, baseline, rollback = pair
    if second == "layerskip" and target.info.arch != "llama":
        pytest.skip("layer skip drafts with llama-like layers only (a hybrid's are refused in one line)")
    drafter = chain(target, draft, ["ngram", second])
    b = FixedBudget(k=4) if budget == "fixed" else prepared(AutoBudget(), target, drafter)
    final, drafted = run(target, drafter, b, prompt, rollback())
    assert final.token_ids == baseline, first_difference(target, prompt, baseline, final.token_ids)
    by = {e.source for e in drafted}
    assert by <= {"ngram", second} and "ngram" in by, by  # the repeated prompt: the n-gram matches
    if budget == "fixed":
        assert second in by, "probe_every=1: a priced-out model still drafts every other chance"
    # summary.json's per-source counts are the events' and the drafter's own
    s = final.stats
    assert sum(s.drafted_by_source.values()) == s.drafted and sum(s.accepted_by_source.values()) == s.accepted
    assert {n: [s.drafted_by_source.get(n, 0), s.accepted_by_source.get(n, 0)] for n in drafter.names} == drafter.counts
    lookups = [e for e in drafted if e.source == "ngram"]
    assert all(e.forwards == 0 for e in lookups), "a free source runs no draft forward"


def test_a_first_source_that_never_proposes_hands_every_step_to_the_next(pair):
    target, draft, prompt, baseline, rollback = pair
    drafter = chain(target, draft, ["ngram", "model"], ngram={"window": 1})  # a match must start in the last token
    final, drafted = run(target, drafter, FixedBudget(k=4), prompt, rollback())
    assert final.token_ids == baseline, first_difference(target, prompt, baseline, final.token_ids)
    assert drafted and {e.source for e in drafted} == {"model"}
    assert drafter.counts["ngram"] == [0, 0]


def test_a_source_that_does_not_pay_is_skipped_and_the_step_is_plain(pair):
    """A draft as big as the target (c = 1 target forward per token) can never beat a plain step: no draft."""
    target, draft, prompt, baseline, rollback = pair
    drafter = chain(target, draft, ["model"], probe_every=10_000)
    final, drafted = run(target, drafter, FixedBudget(k=4), prompt, rollback())
    assert final.token_ids == baseline
    assert not drafted and final.stats.drafted == 0 and final.stats.draft_forwards == 0


@pytest.mark.parametrize("sources", [["ngram", "model"], ["lookahead", "ngram"], ["ngram", "lookahead"]])
def test_a_tree_step_asks_the_sources_too(pair, sources):
    from conftest import run_pipeline

    from specpipe.trees.proposal import tree_parts
    from specpipe.trees.shape import TreeShape

    target, draft, prompt, baseline, _ = pair
    if target.info.arch != "llama":
        pytest.skip("token trees need attention-only targets")
    drafter = chain(target, draft, sources)
    parts = tree_parts(target, drafter, TreeShape(kind="dynamic", nodes=8, depth=4))
    got, final = run_pipeline(target, drafter, prompt, MAX_TOKENS, tree=parts)
    assert got == baseline[: len(got)] and len(got) == MAX_TOKENS and final.stats.tree_steps > 0
    by = final.stats.drafted_by_source  # a tree step's Drafted names its source, as a chain step's does
    assert by and set(by) <= set(sources) and sum(by.values()) == final.stats.drafted, by


# ---------------------------------------------------------------- budget=auto: a lookup class learns by looking back


def test_a_lookup_class_in_a_chain_learns_from_a_look_back_as_ngram_alone_does(monkeypatch):
    """draft=ngram's classes learn on plain steps by looking back; the chain [ngram, layerskip] offered no look
    back (the layer skip cannot look back) and, on SmolLM2, verified half as many n-gram tokens. Now its n-gram
    looks back on plain steps and auto counts that for the class alone, as draft=ngram's: the same class
    rates from the same look backs, the layer skip's pooled rates untouched, the chain's own class price too."""
    import specpipe.budgets.rates as rates
    from specpipe.drafters.ngram import NgramDrafter

    monkeypatch.setattr(rates, "LEARNED", {})  # no rates carried from this module's earlier runs
    target = tiny("llama")
    prompt = target.encode_prompt(PROMPT, chat=False)
    chained = chain(target, None, ["ngram", "layerskip"])
    n = chained.sources[0]
    assert isinstance(n, NgramDrafter)
    alone = NgramDrafter(min_n=n.min_n, max_n=n.max_n, window=n.window)
    b_alone, b_chain = (prepared(AutoBudget(k_max=16), target, d) for d in (alone, chained))
    for b in (b_alone, b_chain):
        b.ratio = {1: 1.0, **{m: 1.0 + 0.05 * (m - 1) for m in range(2, 34)}}  # the same curve for both
    model_rates = (list(b_chain.rates.first), list(b_chain.rates.next))
    for b in (b_alone, b_chain):
        b.next_k()
        b.fit_k(1, 16)  # class 1 is known, from its prior: 0.5 in both (not the layer skip's rates)
    for _ in range(10):
        for b in (b_alone, b_chain):
            b.observe_hindsight(2, 2, evidence=1)
    assert b_chain.rates.of_class(1) == b_alone.rates.of_class(1)
    assert (b_chain.rates.first, b_chain.rates.next) == model_rates, "a lookup's look back is no evidence on the model"
    for _ in range(8):  # past the model's probes (each rejected) to a plain step
        if b_chain.next_k() == 0:
            break
        b_chain.observe(b_chain.k, 0)
    assert b_chain.k == 0 and b_chain.hindsight_k == b_chain.probe_k, "a plain step looks back, as draft=ngram's"
    assert not b_chain.hindsight, "the layer skip is probed by verifies still: it cannot look back"

    # the chain looks back with its n-gram (the layer skip cannot), and its own class price learns from it
    chained.use_rollback(TrimRollback())
    chained.prefill(prompt)
    guess = chained.hindsight(prompt, 2)
    assert chained.supports_hindsight and guess == alone_guess(alone, prompt) and guess
    price = chained._class_price(0, chained.last_evidence)
    assert sum(price.first) > 2.0, "the look back was counted for the chain's class price"


def alone_guess(drafter, prompt: list[int]) -> list[int]:
    drafter.prefill(prompt)
    return drafter.hindsight(prompt, 2)


def test_a_chain_under_auto_looks_back_on_plain_steps_and_stays_lossless(monkeypatch):
    """The pipeline's look back (core/proposal.py) through the chain: plain steps carry the n-gram's guess."""
    import specpipe.budgets.rates as rates

    monkeypatch.setattr(rates, "LEARNED", {})
    target = tiny("llama")
    prompt = target.encode_prompt(PROMPT, chat=False)
    baseline, _ = run(target, NoneDrafter(), FixedBudget(k=1), prompt)
    drafter = chain(target, None, ["ngram", "layerskip"])
    budget = prepared(AutoBudget(), target, drafter)
    pipe = SpeculativePipeline(target, drafter, budget, GreedyComparator(), TrimRollback(), GreedyBonus())
    events = list(pipe.run(prompt, MAX_TOKENS, stop_ids=set()))
    final = events[-1]
    assert isinstance(final, RunFinished) and final.token_ids == baseline.token_ids
    looked = [e for e in events if isinstance(e, Drafted) and e.hindsight_ids]
    assert looked and all(not e.draft_ids for e in looked), "plain steps looked back"
    assert final.stats.hindsight_checked == sum(len(e.hindsight_ids) for e in looked) > 0


def test_the_run_header_names_the_chains_sources(capsys):
    from specpipe.cli.generate import TerminalPrinter
    from specpipe.run.session import Session

    overrides = ["model=tiny-random", "draft=chain", "draft.sources=[ngram,layerskip]", "draft.layerskip.depth=1"]
    with initialize_config_dir(version_base=None, config_dir=CONF_DIR):
        cfg = compose("config", overrides=[*overrides, "budget=fixed", "budget.k=2"])
    session = Session(cfg)
    started = next(session.generate(session.target.encode_prompt("a b a b", chat=False), max_tokens=2))
    assert started.drafter == "chain[ngram>layerskip]"
    TerminalPrinter(stream=False)(started)
    assert "drafter=chain[ngram>layerskip]," in capsys.readouterr().err


# ---------------------------------------------------------------- sampling: the proposing source's q


def test_sampling_hands_the_comparator_the_proposing_sources_own_q():
    target = tiny("llama")
    draft = noisy_copy(target, scale=0.5)
    prompt = target.encode_prompt("the cat sat on the mat", chat=False)
    alone = ModelDrafter(target=target, load=lambda **_: draft, model="other", sampler=Sampler(1.0, seed=3))
    chained = chain(target, draft, ["ngram", "model"], sampler=Sampler(1.0, seed=3), ngram={"window": 1})
    chained.prices[1].c = 0.1  # as if timed cheap: the model pays and drafts at once
    for d in (alone, chained):
        d.use_rollback(TrimRollback())
        d.prefill(prompt)
    a = alone.propose(prompt, StepPlan(k=4))
    b = chained.propose(prompt, StepPlan(k=4))
    assert b.source == "model" and b.token_ids == a.token_ids
    assert a.probs is not None and b.probs is not None and (b.probs == a.probs).all().item()


def test_sampled_chain_runs_finish_and_repeat_under_a_seed():
    target = tiny("llama")
    draft = noisy_copy(target, scale=0.5)
    prompt = target.encode_prompt(PROMPT, chat=False)
    outputs = []
    for _ in range(2):
        sampler = Sampler(0.8, seed=5)
        drafter = chain(target, draft, ["ngram", "model"], sampler=sampler)
        final, drafted = run(
            target, drafter, FixedBudget(k=4), prompt, comparator=RejectionComparator(sampler=sampler),
            bonus=SampledBonus(sampler=sampler),
        )  # fmt: skip
        assert final.stop_reason == "max_tokens" and len(final.token_ids) == MAX_TOKENS and drafted
        outputs.append(final.token_ids)
    assert outputs[0] == outputs[1]


# ---------------------------------------------------------------- bad source lists, events


@pytest.mark.parametrize(
    "sources, says",
    [
        ("[ngram,chain]", "a chain cannot ask a chain"),
        ("[ngram,bogus]", "'bogus', not a drafter a chain can ask"),
        ("[ngram,ngram]", "ngram twice"),
        ("[]", "name the drafters to ask"),
        ("[none]", "draft=none drafts nothing"),
        ("[ngram,lookahead]", "drafts only token trees"),
    ],
)
def test_a_bad_source_list_is_one_line_at_preflight(sources, says):
    with initialize_config_dir(version_base=None, config_dir=CONF_DIR):
        cfg = compose("config", overrides=["draft=chain", f"draft.sources={sources}"])
    message = check_config(cfg)
    assert message is not None and says in message and "\n" not in message
    if "lookahead" not in sources:  # the constructor says the same (the tree is preflight's to know)
        assert check_sources(list(cfg.draft.sources), tree=None) == message


def test_the_cli_refuses_a_chain_of_chains_in_one_line(tmp_path):
    proc = run_module("specpipe.cli", ["model=tiny-random", "draft=chain", "draft.sources=[chain]"], tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "a chain cannot ask a chain" in proc.stderr


def test_recordings_without_a_source_still_read():
    old = b'{"kind":"drafted","t":0.1,"step":1,"k":2,"draft_ids":[5,6],"seconds":0.01}'
    event = msgspec.json.Decoder(Event).decode(old)
    assert isinstance(event, Drafted) and event.source == ""


# ---------------------------------------------------------------- sources that read the target's forwards


def test_heads_in_a_chain_get_every_verifys_hidden_states_and_taps(tmp_path):
    """An MTP head (final hidden states) and an EAGLE-3 head (layer taps) behind the n-gram: lossless, and
    their tapes hold the whole context on steps the n-gram drafted (no target forward of their own)."""
    from eagle3_tiny import head_config, random_weights, write

    from specpipe.drafters.mtp_head import new_head, save_head
    from specpipe.engine.introspect import llama_parts
    from specpipe.engine.load.loader import load_engine

    target = load_engine("tiny-random", precision="float32", arch="llama", seed=0, tiny={"num_hidden_layers": 8})
    prompt = target.encode_prompt(PROMPT, chat=False)
    baseline, _ = run(target, NoneDrafter(), FixedBudget(k=1), prompt)
    inner, _ = llama_parts(target.model, "mtp")
    head, _ = new_head(inner)
    save_head(head, tmp_path / "mtp", {"target": {"name": target.info.name, "sha256": target.info.sha256}})
    cfg = head_config()
    eagle = write(tmp_path / "eagle3", "eagle", cfg, random_weights(cfg, seed=1))
    drafter = chain(
        target,
        None,
        ["ngram", "mtp", "eagle3"],
        ngram={"min_n": 3},  # matches on the prompt's repeats, not on every step: the heads get steps too
        mtp={"head": str(tmp_path / "mtp")},
        eagle3={"path": str(eagle)},
    )
    assert drafter.capture is not None and drafter.capture.hidden and drafter.capture.layers
    for budget in (FixedBudget(k=4), prepared(AutoBudget(), target, drafter)):
        final, drafted = run(target, drafter, budget, prompt)
        assert final.token_ids == baseline.token_ids, first_difference(
            target, prompt, baseline.token_ids, final.token_ids
        )
        assert "ngram" in {e.source for e in drafted}
    mtp, eagle3 = drafter.sources[1:]
    assert mtp.forwards > 0 and eagle3.forwards > 0, "probe_every=1: each head drafted now and then"
    assert mtp.target_recomputes == 0 and eagle3.target_recomputes == 0  # type: ignore[attr-defined]


# ---------------------------------------------------------------- pricing


def test_a_price_skips_what_cannot_pay_and_probes_after_probe_every():
    from specpipe.drafters.source_price import SourcePrice

    dear = SourcePrice(c=1.0)  # a drafted token costs a whole target forward: never beats a plain step
    assert [dear.k_to_draft(8, slope=0.0, probe_every=3) for _ in range(5)] == [0, 0, 0, 8, 0]
    cheap = SourcePrice(c=0.3)
    for _ in range(20):
        cheap.observe(8, 8)  # every draft held entirely
    assert cheap.k_to_draft(8, slope=0.02, probe_every=3) == 8
    for _ in range(20):
        cheap.observe(8, 0)  # then none held (the continuation, untested, stays where it was: bursty drafts)
    assert cheap.k_to_draft(8, slope=0.02, probe_every=3) == 0
    cheap.charge(draft_s=0.4, drafted=4, t1_s=0.1)  # 0.1 s per token over a 0.1 s target forward: c -> 1
    assert cheap.c == pytest.approx(0.9 * 0.3 + 0.1 * 1.0) and cheap.timed == 1


def test_a_free_draft_whose_class_does_not_pay_hands_the_step_to_the_next_source():
    """Once verifies cost something (auto's t_verify), an n-gram class that never holds is cut to nothing
    and the model drafts instead; with the class's rates good the n-gram keeps the step."""
    from specpipe.events import BudgetDecision

    target = tiny("llama")
    draft = noisy_copy(target, scale=0.5)
    prompt = target.encode_prompt(PROMPT, chat=False)
    drafter = chain(target, draft, ["ngram", "model"])
    drafter.prices[1].c = 0.05
    drafter.use_rollback(TrimRollback())
    drafter.prefill(prompt)
    plan = StepPlan(k=4, decision=BudgetDecision(k=4, reason="cost model", t_verify=2.0))  # slope 0.25
    first = drafter.propose(prompt, plan)
    assert first.source == "ngram", "the repeated prompt matches"
    evidence = drafter.last_evidence
    assert evidence is not None
    price = drafter._class_price(0, evidence)
    for _ in range(30):
        price.observe(4, 0)
    drafter.rollback(len(prompt))
    assert drafter.propose(prompt, plan).source == "model"
    for _ in range(60):
        price.observe(4, 4)
    drafter.rollback(len(prompt))
    assert drafter.propose(prompt, plan).source == "ngram"


def test_the_chat_panel_names_the_source_of_the_latest_step():
    from specpipe.events import Verified
    from tui.figures import Figures

    figures = Figures()
    for event in (
        Drafted(t=0.1, step=1, k=4, draft_ids=[1, 2, 3], seconds=0.0, source="ngram"),
        Verified(t=0.2, step=1, accepted_ids=[1, 2], rejected_ids=[3], recovered_id=9, seconds=0.0),
        Drafted(t=0.3, step=2, k=4, draft_ids=[5, 6], seconds=0.0, source="model"),
        Verified(t=0.4, step=2, accepted_ids=[5, 6], rejected_ids=[], bonus_id=7, seconds=0.0),
    ):
        figures.consume(event)
    rows = dict(figures.rows())
    assert rows["K"] == "4 (model)" and rows["sources"] == "ngram 2/3, model 2/2"


# ---------------------------------------------------------------- sampling is exact (statistical, -m statistical)


@pytest.fixture(scope="module")
def small_vocab_models():
    """test_sampling's pair: an 8-id target and a poor noisy copy (many rejections exercise the residual)."""
    from test_sampling import VOCAB

    from specpipe.engine.load.loader import load_engine

    target = load_engine("tiny-random", precision="float32", arch="llama", seed=3, tiny={"vocab_size": VOCAB})
    return target, noisy_copy(target, scale=3.0, seed=7, tiny={"vocab_size": VOCAB})


def sampled_chain(target, draft, sampler):
    """[ngram, model] where the n-gram never proposes and the model, priced as cheap, drafts every step."""
    drafter = chain(target, draft, ["ngram", "model"], sampler=sampler, ngram={"window": 1})
    drafter.prices[1].c = 0.05
    return drafter


@pytest.mark.statistical
@pytest.mark.parametrize("broken", [False, True])
def test_sampling_through_a_chain_keeps_the_target_distribution(small_vocab_models, monkeypatch, broken):
    """Chi-square of two sampled tokens against the target's exact joint (test_sampling's test); the same test
    rejects a chain that hands the comparator a q that is not the proposing model's (its rows shifted by one
    id, as another source's would be). Dropping q altogether would still be exact (a point mass, as n-gram
    drafts are), only accepted less often."""
    from test_sampling import chi_square_rejects, exact_joint, sample_pairs

    target, draft = small_vocab_models
    sampler = Sampler(temperature=1.0, top_k=6)
    prompt = [1, 2, 3, 1, 2]
    joint = exact_joint(target, sampler, prompt)
    if broken:
        propose = ChainDrafter.propose

        def wrong_q(self, context_ids, plan):
            d = propose(self, context_ids, plan)
            d.probs = mx.roll(d.probs, 1, axis=-1) if d.probs is not None else None
            return d

        monkeypatch.setattr(ChainDrafter, "propose", wrong_q)
    drafter = sampled_chain(target, draft, sampler)
    rejects, stat, critical = chi_square_rejects(
        sample_pairs(target, drafter, RejectionComparator, sampler, prompt), joint
    )
    assert drafter.counts["model"][0] > 0 and drafter.counts["ngram"] == [0, 0]
    assert rejects == broken, f"chi-square {stat:.1f} vs {critical:.1f} (broken={broken})"


# ---------------------------------------------------------------- the real SmolLM2-135M


def test_smollm2_chain_of_ngram_and_layerskip_equals_target_alone(smollm2):
    """The real model under budget=auto (the tiny models cover fixed K): ~15 s on a shared 2-core CPU."""
    prompt = smollm2.encode_prompt("Repeat this code exactly:\ndef add(a, b):\n    return a + b\n", chat=True)
    baseline, _ = run(smollm2, NoneDrafter(), FixedBudget(k=1), prompt, max_tokens=32)
    drafter = chain(smollm2, None, ["ngram", "layerskip"], layerskip={"depth": 8})
    final, drafted = run(smollm2, drafter, prepared(AutoBudget(), smollm2, drafter), prompt, max_tokens=32)
    assert final.token_ids == baseline.token_ids, first_difference(smollm2, prompt, baseline.token_ids, final.token_ids)
    assert drafted and {e.source for e in drafted} <= {"ngram", "layerskip"}
