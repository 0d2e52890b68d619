"""Drafters without a second model: layer skip, MTP heads (checkpoint and
trained), and the head trainer. Greedy output must equal draft=none."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from conftest import CONF_DIR, first_difference, generate, make_drafter, tiny
from hydra import compose, initialize_config_dir
from mlx.utils import tree_flatten

import specpipe.config.schema  # noqa: F401  (registers the schemas)
from specpipe.budgets.auto import AutoBudget
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.plan import StepPlan
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.costmodel.calibration import draft_cost
from specpipe.drafters.layerskip import LayerSkipDrafter
from specpipe.drafters.mtp import MtpDrafter
from specpipe.drafters.mtp_head import new_head, save_head
from specpipe.engine.engine import HIDDEN
from specpipe.engine.introspect import llama_parts
from specpipe.errors import SpecpipeError
from specpipe.rollbacks.trim import TrimRollback

KS = [1, 2, 4, 8, 16, 32]
ARCHS = ["llama", "qwen2", "qwen3"]
PROMPT = "the cat sat on the mat, the cat sat on the"


def random_head(target, folder, seed=0):
    """A head with random weights saved where draft.head can find it (exactness needs no training)."""
    inner, _ = llama_parts(target.model, "mtp")
    mx.random.seed(seed)
    head, _ = new_head(inner)
    save_head(head, folder, {"target": {"name": target.info.name, "sha256": target.info.sha256}})
    return str(folder)


@pytest.fixture(scope="module", params=ARCHS)
def setup(request, tmp_path_factory):
    target = tiny(request.param)
    prompt = target.encode_prompt(PROMPT, chat=False)
    baseline, _, _, _ = generate(target, make_drafter("none", target), 1, prompt, 48)
    return target, prompt, baseline, random_head(target, tmp_path_factory.mktemp("head"))


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("kind", ["layerskip", "mtp"])
def test_greedy_equals_target_alone(setup, kind, k):
    target, prompt, baseline, head = setup
    drafter = LayerSkipDrafter(target=target, depth=1) if kind == "layerskip" else MtpDrafter(target=target, head=head)
    got, final, _, _ = generate(target, drafter, k, prompt, 48)
    assert got == baseline, first_difference(target, prompt, baseline, got)
    assert final.stop_reason == "max_tokens"


def run_with(target, drafter, rollback: str, k: int, prompt, max_tokens: int) -> list[int]:
    from specpipe.budgets.fixed import FixedBudget
    from specpipe.core.pipeline import SpeculativePipeline
    from specpipe.core.stages.bonus import GreedyBonus
    from specpipe.core.stages.compare import GreedyComparator
    from specpipe.rollbacks.auto import AutoRollback
    from specpipe.rollbacks.checkpoint import CheckpointRollback
    from specpipe.rollbacks.recompute import RecomputeRollback
    from specpipe.rollbacks.trim import TrimRollback

    strategy = {
        "trim": TrimRollback,
        "checkpoint": CheckpointRollback,
        "recompute": RecomputeRollback,
        "auto": AutoRollback,
    }[rollback]
    pipe = SpeculativePipeline(target, drafter, FixedBudget(k=k), GreedyComparator(), strategy(), GreedyBonus())
    return list(pipe.run(prompt, max_tokens, stop_ids=set()))[-1].token_ids


@pytest.mark.parametrize("rollback", ["checkpoint", "recompute", "auto"])
@pytest.mark.parametrize("kind", ["layerskip", "mtp"])
def test_every_rollback_strategy_keeps_greedy_output(setup, kind, rollback):
    """Trim is covered above at every K; the other strategies at short, middle and the longest budget."""
    target, prompt, baseline, head = setup
    for k in (1, 8, 32):
        drafter = (
            LayerSkipDrafter(target=target, depth=1) if kind == "layerskip" else MtpDrafter(target=target, head=head)
        )
        got = run_with(target, drafter, rollback, k, prompt, 48)
        assert got == baseline, f"K={k}: " + first_difference(target, prompt, baseline, got)


@pytest.mark.parametrize("p_min", [0.3, 0.999])
def test_mtp_confidence_stop_stays_lossless(setup, p_min):
    """budget=confidence with a head: unsure chains stop early (even before the first token), output unchanged."""
    target, prompt, baseline, head = setup
    drafter = MtpDrafter(target=target, head=head)
    drafter.p_min = p_min
    got, final, _, _ = generate(target, drafter, 8, prompt, 48)
    assert got == baseline, first_difference(target, prompt, baseline, got)
    assert final.stats.drafted < 8 * final.stats.steps


def test_layerskip_with_all_layers_accepts_everything(setup):
    """Every layer = the target itself: acceptance 1.0 (the self-draft invariant)."""
    target, prompt, baseline, _ = setup
    got, final, _, _ = generate(target, LayerSkipDrafter(target=target, layers=[0, 1]), 4, prompt, 25)
    assert got == baseline[:25] and final.stats.acceptance_rate == 1.0


def test_budget_auto_prices_partial_target_drafters_by_the_bytes_they_read(setup):
    """c for auto's cost model: a layer subset or an MTP head reads part of the target's weights, never 0 or 1."""
    target, _, _, head = setup
    one, two = (LayerSkipDrafter(target=target, layers=ids) for ids in ([0], [0, 1]))
    mtp = MtpDrafter(target=target, head=head)
    cost = {name: draft_cost(d, target) for name, d in [("one", one), ("two", two), ("mtp", mtp)]}
    assert 0 < cost["one"] < cost["two"] <= 1.0 + 1e-6  # [0, 1] is the whole (2-layer) tiny target
    assert 0 < cost["mtp"] < 1.0


def test_mtp_drafts_equal_a_full_recompute(setup):
    """The head's incremental cache (trimmed every step) gives the drafts a from-scratch run gives."""
    target, prompt, _, head = setup
    drafter = MtpDrafter(target=target, head=head)
    inner, lm_head = drafter.inner, drafter.lm_head
    _, _, events, _ = generate(target, drafter, 4, prompt, 40)
    context = list(prompt)
    for e in events:
        if type(e).__name__ == "Drafted" and e.draft_ids:
            hidden = inner(mx.array(context[:-1], dtype=mx.uint32)[None])
            x = drafter.head(hidden, inner.embed_tokens(mx.array(context[1:], dtype=mx.uint32))[None])
            ids, seq_h, seq_t = [], x, list(context[1:])
            for _ in range(len(e.draft_ids)):
                y = int(mx.argmax(lm_head(seq_h[:, -1]), axis=-1).item())
                ids.append(y)
                # chained pair: (head output, drafted token) appended to the full sequence
                hidden = mx.concatenate([hidden, seq_h[:, -1:]], axis=1)
                seq_t.append(y)
                seq_h = drafter.head(hidden, inner.embed_tokens(mx.array(seq_t, dtype=mx.uint32))[None])
            assert ids == e.draft_ids
        if type(e).__name__ == "Emitted":
            context.extend(e.token_ids)
    assert drafter.target_recomputes == 0  # the tape always held the context


def test_mtp_hindsight_equals_the_proposal_it_would_have_made_earlier(setup):
    """A look back reads only the tape, gives a fresh head's greedy draft, and leaves the drafter exact."""
    target, prompt, baseline, head = setup
    drafter = MtpDrafter(target=target, head=head)
    _, _, _, pipe = generate(target, drafter, 4, prompt, 12)
    context = pipe.context
    forwards_before = drafter.target_recomputes
    guess = drafter.hindsight(context, 3)
    fresh = MtpDrafter(target=target, head=head)
    fresh.prefill(prompt)
    assert guess == fresh.propose(context[:-3], StepPlan(k=3)).token_ids and len(guess) == 3
    assert drafter.target_recomputes == forwards_before == 0
    assert (
        drafter.propose(context, StepPlan(k=4)).token_ids
        == MtpDrafter(target=target, head=head).propose(context, StepPlan(k=4)).token_ids
    )


@pytest.mark.parametrize("kind", ["mtp", "ngram"])
def test_auto_with_hindsight_probes_keeps_greedy_output(setup, kind):
    """Verify cost T(n) = n (auto's uncalibrated prior): K stays 0 and every probe is a look back."""
    target, prompt, baseline, head = setup
    drafter = MtpDrafter(target=target, head=head) if kind == "mtp" else make_drafter("ngram", target)
    budget = AutoBudget()  # not prepared: no calibration, the prior T(n) = n
    budget.hindsight = drafter.supports_hindsight
    budget.c = draft_cost(drafter, target)
    pipe = SpeculativePipeline(target, drafter, budget, GreedyComparator(), TrimRollback(), GreedyBonus())
    events = list(pipe.run(prompt, 48, stop_ids=set()))
    final = events[-1]
    assert final.token_ids == baseline, first_difference(target, prompt, baseline, final.token_ids)
    drafted = [e for e in events if type(e).__name__ == "Drafted"]
    looked = [e for e in drafted if e.hindsight_ids]
    assert all(e.k == 0 and not e.draft_ids for e in drafted) and len(looked) >= (2 if kind == "mtp" else 8)
    assert final.stats.hindsight_checked == sum(len(e.hindsight_ids) for e in looked) and final.stats.drafted == 0


def test_mtp_survives_the_target_being_used_in_between(setup):
    """Another forward on the target between steps cannot corrupt the hidden states."""
    target, prompt, baseline, head = setup
    drafter = MtpDrafter(target=target, head=head)
    original = drafter.propose

    def propose(context, k):
        target.forward(
            mx.array([5, 6, 7], dtype=mx.uint32), target.make_cache(), capture=HIDDEN
        )  # another user of the target
        return original(context, k)

    drafter.propose = propose
    got, _, _, _ = generate(target, drafter, 4, prompt, 20)
    assert got == baseline[:20]
    # The hidden states come from the pipeline's own forwards (ForwardResult), so another
    # forward on the target cannot reach them: nothing needs recomputing.
    assert drafter.target_recomputes == 0


# ---------------------------------------------------------------- SmolLM2


@pytest.fixture(scope="module")
def smollm2_case(smollm2):
    prompt = smollm2.encode_prompt("def fibonacci(n):", chat=False)
    baseline, _, _, _ = generate(smollm2, make_drafter("none", smollm2), 1, prompt, 24)
    return prompt, baseline


@pytest.mark.parametrize("kind", ["layerskip", "mtp"])
def test_smollm2_greedy_equals_target_alone(smollm2, smollm2_case, tmp_path, kind):
    """K = 1, 4, 16 on the real model (one drafter, re-prefilled per run, as sessions do); every K of KS runs on
    the tiny architectures above, and a real model's sweep of all six cost a minute of the suite."""
    prompt, baseline = smollm2_case
    if kind == "layerskip":
        drafter = LayerSkipDrafter(target=smollm2, depth=8)
    else:
        drafter = MtpDrafter(target=smollm2, head=random_head(smollm2, tmp_path))
    for k in (1, 4, 16):
        got, _, _, _ = generate(smollm2, drafter, k, prompt, 24)
        assert got == baseline, f"K={k}: " + first_difference(smollm2, prompt, baseline, got)


# ---------------------------------------------------------------- checkpoint heads and errors


def qwen35_checkpoint(folder, with_mtp: bool):
    """A tiny Qwen3.5 folder in Hugging Face layout (names, shapes, conv1d axis,
    zero-centred norms), with `mtp.*` tensors like the real checkpoints ship."""
    from specpipe.engine.load.tiny import byte_tokenizer, tiny_config

    source = tiny("qwen3_5")
    config = tiny_config("qwen3_5")
    weights = {}
    for k, v in tree_flatten(source.model.parameters()):
        k = k.replace("language_model.model.", "model.language_model.").replace("language_model.lm_head", "lm_head")
        if "conv1d.weight" in k:
            v = v.moveaxis(1, 2)
        elif k.endswith("norm.weight") and "linear_attn.norm" not in k:
            v = v - 1.0
        weights[k] = v
    mtp = {}
    if with_mtp:
        h = config["hidden_size"]
        attn = next(layer for layer in source.model.language_model.model.layers if not layer.is_linear)
        key = mx.random.key(7)
        shapes = {
            "fc.weight": (h, 2 * h),
            "pre_fc_norm_embedding.weight": (h,),
            "pre_fc_norm_hidden.weight": (h,),
            "norm.weight": (h,),
        }
        shapes.update({f"layers.0.{k}": v.shape for k, v in tree_flatten(attn.parameters())})
        for name, shape in shapes.items():
            key, sub = mx.random.split(key)
            mtp[name] = (0.1 if len(shape) == 1 else shape[-1] ** -0.5) * mx.random.normal(shape, key=sub)
        weights.update({f"mtp.{k}": v for k, v in mtp.items()})
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    text = {k: v for k, v in config.items() if k != "model_type"}
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen3_5",
                "text_config": {"model_type": "qwen3_5_text", "mtp_num_hidden_layers": 1, **text},
                "tie_word_embeddings": False,
            }
        )
    )
    byte_tokenizer().save_pretrained(str(folder))
    return mtp


def test_qwen35_checkpoint_mtp_head_loads_and_is_lossless(tmp_path):
    from specpipe.budgets.fixed import FixedBudget
    from specpipe.core.pipeline import SpeculativePipeline
    from specpipe.core.stages.bonus import GreedyBonus
    from specpipe.core.stages.compare import GreedyComparator
    from specpipe.engine.load.loader import load_engine
    from specpipe.rollbacks.recompute import RecomputeRollback

    mtp = qwen35_checkpoint(tmp_path / "qwen35", with_mtp=True)
    target = load_engine(path=str(tmp_path / "qwen35"), precision="float32")
    drafter = MtpDrafter(target=target)  # no draft.head: found in the model's own folder
    assert "checkpoint" in drafter.source
    loaded = dict(tree_flatten(drafter.head.parameters()))
    assert mx.allclose(loaded["fc.weight"], mtp["fc.weight"]).item()
    assert mx.allclose(loaded["norm.weight"], mtp["norm.weight"] + 1.0).item()  # zero-centred in the file
    prompt = target.encode_prompt(PROMPT, chat=False)

    def run(d, k):
        pipe = SpeculativePipeline(target, d, FixedBudget(k=k), GreedyComparator(), RecomputeRollback(), GreedyBonus())
        return list(pipe.run(prompt, 32, stop_ids=set()))[-1].token_ids

    baseline = run(make_drafter("none", target), 1)
    for k in (1, 4):
        assert run(MtpDrafter(target=target), k) == baseline


@pytest.mark.parametrize("rollback", ["checkpoint", "recompute", "auto"])
def test_hybrid_target_with_its_own_mtp_head_every_rollback(tmp_path, rollback):
    """Qwen3.5 layout (Gated DeltaNet + attention): the checkpoint's head at K = 1, 8, 32
    (layer skip refuses it, clearly)."""
    from specpipe.engine.load.loader import load_engine

    qwen35_checkpoint(tmp_path / "qwen35", with_mtp=True)
    target = load_engine(path=str(tmp_path / "qwen35"), precision="float32")
    prompt = target.encode_prompt(PROMPT, chat=False)
    baseline = run_with(target, make_drafter("none", target), "recompute", 1, prompt, 32)
    for k in (1, 8, 32):
        got = run_with(target, MtpDrafter(target=target), rollback, k, prompt, 32)
        assert got == baseline, f"K={k}: " + first_difference(target, prompt, baseline, got)
    with pytest.raises(SpecpipeError, match="not a full-attention block"):
        LayerSkipDrafter(target=target, depth=1)


def test_folder_without_mtp_weights_names_the_drafters_that_work(tmp_path):
    from specpipe.engine.load.loader import load_engine

    qwen35_checkpoint(tmp_path / "plain", with_mtp=False)
    target = load_engine(path=str(tmp_path / "plain"), precision="float32")
    with pytest.raises(SpecpipeError) as err:
        MtpDrafter(target=target)
    message = str(err.value)
    assert (
        "\n" not in message
        and "no MTP head" in message
        and "draft=layerskip" in message
        and "specpipe-train-drafter" in message
    )


def test_layerskip_refuses_other_structures():
    with pytest.raises(SpecpipeError, match="llama-like"):
        LayerSkipDrafter(target=tiny("mamba2"), depth=1)
    with pytest.raises(SpecpipeError, match="draft.depth"):
        LayerSkipDrafter(target=tiny("llama"), depth=2)


# ---------------------------------------------------------------- config and trainer


@pytest.mark.parametrize("draft", ["layerskip", "mtp"])
def test_config_composes(draft):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=[f"draft={draft}", "model=tiny-random"])
    assert cfg.draft.name == draft


def test_train_drafter_writes_a_loadable_head_and_resumes(tmp_path):
    from specpipe.train.drafter import train

    corpus = tmp_path / "corpus.py"
    corpus.write_text("def add(a, b):\n    return a + b\n" * 60)
    overrides = [
        "model=tiny-random",
        f"corpus={corpus}",
        f"out={tmp_path / 'head'}",
        "sequences=6",
        "batch=2",
        "seq_len=32",
        "chunk=3",
        "save_every=2",
        "warmup=1",
        "hydra.run.dir=.",
    ]
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        first = compose(config_name="train_drafter", overrides=overrides + ["steps=2", "resume=false"])
        more = compose(config_name="train_drafter", overrides=overrides + ["steps=4"])
        fresh = compose(
            config_name="train_drafter", overrides=overrides + ["steps=4", "resume=false", f"out={tmp_path / 'again'}"]
        )
    train(first)
    assert json.loads((tmp_path / "head" / "mtp_head.json").read_text())["steps"] == 2
    train(more)  # picks up at step 2
    assert json.loads((tmp_path / "head" / "mtp_head.json").read_text())["steps"] == 4
    train(fresh)  # same seed from scratch: the same head
    a = mx.load(str(tmp_path / "head" / "mtp_head.safetensors"))
    b = mx.load(str(tmp_path / "again" / "mtp_head.safetensors"))
    assert all(mx.allclose(a[k], b[k], atol=1e-5).item() for k in a)
    target = tiny("llama")
    drafter = MtpDrafter(target=target, head=str(tmp_path / "head"))
    prompt = target.encode_prompt(PROMPT, chat=False)
    baseline, _, _, _ = generate(target, make_drafter("none", target), 1, prompt, 20)
    assert generate(target, drafter, 4, prompt, 20)[0] == baseline


def test_train_drafter_mixes_in_the_targets_own_answers(tmp_path):
    """answers=0.5: half the sequences are chat prompt tails + the target's greedy answer, and a head trains on them."""
    from specpipe.train.answers import answer_sequences, task_prompts
    from specpipe.train.drafter import train

    corpus = tmp_path / "corpus.py"
    corpus.write_text("".join(f"def add_{i}(a, b):\n    total = a + b\n    return total * {i}\n\n" for i in range(40)))
    target = tiny("llama")
    prompts = list(zip(task_prompts([corpus], seed=0), range(3)))
    assert len({p for p, _ in prompts}) == 3  # a one-file corpus still gives distinct tasks
    seqs = answer_sequences(target, [corpus], n=3, seq_len=48, seed=0, batch=2)
    assert len(seqs) == 3 and all(len(s) == 48 for s in seqs)
    header = target.encode_prompt("x", chat=True)[-3:]  # the assistant turn's opening tokens
    assert all(any(s[i : i + 3] == header for i in range(len(s) - 2)) for s in seqs)  # each holds its prompt's end

    overrides = [
        "model=tiny-random",
        f"corpus={corpus}",
        f"out={tmp_path / 'head'}",
        "sequences=4",
        "answers=0.5",
        "batch=2",
        "seq_len=48",
        "chunk=2",
        "steps=2",
        "warmup=1",
        "hydra.run.dir=.",
    ]
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="train_drafter", overrides=overrides)
        bad = compose(config_name="train_drafter", overrides=overrides + ["answers=1.5", f"out={tmp_path / 'bad'}"])
    train(cfg)
    assert (tmp_path / "head" / "train_state" / "corpus-0-4x48-answers0.5.safetensors").exists()
    assert json.loads((tmp_path / "head" / "mtp_head.json").read_text())["train"]["answers"] == 0.5
    with pytest.raises(SpecpipeError, match="answers=1.5"):
        train(bad)
