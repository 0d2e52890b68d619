"""Every drafter batched at the target (batch/decoder.py over core/step.py), on tiny random models (llama, qwen3;
hybrid qwen3_next, sliding-window gemma3, recurrent mamba2), in process:
4 rows stepping together, each with its own drafter, sampler and budget built from the config as the server
builds them (`session_plugins`), give each request exactly its answer alone: greedy, draft=none's tokens;
sampled, the CLI pipeline's tokens for the same seed. (tests/test_serve_batch_all.py: the same through HTTP.)"""

from __future__ import annotations

import pytest
from hydra import compose, initialize

import specpipe.config  # noqa: F401  (registers the schemas)
from specpipe.batch.decoder import BatchDecoder, session_plugins
from specpipe.drafters.mtp_head import new_head, save_head
from specpipe.events import Drafted, RunFinished
from specpipe.session import Session

TEXTS = [
    "the cat sat on the mat, the cat sat on the",
    "Quick zephyrs blow, vexing daft Jim",
    "ab",
    "def f(x):\n    return x + 1\n\ndef g(x):\n    return",
]
MAX_TOKENS = [24, 17, 24, 11]  # rows leave at different steps
DRAFTS = {
    "none": ["draft=none"],
    "ngram": ["draft=ngram"],
    "model": ["draft=model", "draft.model=tiny-random"],
    "layerskip": ["draft=layerskip", "draft.depth=1"],
    "mtp": ["draft=mtp"],  # draft.head= a random head, saved per arch below
}


def _cfg(overrides: list[str]):
    with initialize(version_base=None, config_path="../specpipe/conf"):
        return compose(config_name="config", overrides=["budget=fixed", "budget.k=4", *overrides])


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def arch(request):
    return request.param


@pytest.fixture(scope="module")
def head(arch, tmp_path_factory):
    """A random MTP head for this arch's tiny target (exactness needs no training)."""
    target = Session(_cfg(["model=tiny-random", f"model.arch={arch}", "draft=none"])).target
    inner, _ = target.hidden_parts()
    module, _ = new_head(inner)
    folder = tmp_path_factory.mktemp(f"head-{arch}")
    save_head(module, folder, {"target": {"name": target.info.name, "sha256": target.info.sha256}})
    return str(folder)


def _session(arch: str, draft: str, head: str, sampled: bool) -> Session:
    extra = [f"draft.head={head}"] if draft == "mtp" else []
    sampling = ["sampling=sample", "sampling.temperature=1.0"] if sampled else []
    return Session(_cfg(["model=tiny-random", f"model.arch={arch}", *DRAFTS[draft], *extra, *sampling]))


def _batched(session: Session, seeds: list[int], events: list | None = None) -> list[list[int]]:
    """The 4 requests as rows of one batch; every drafter but none really drafts. `events`: gets every row's."""
    decoder = BatchDecoder(session.target, session_plugins(session))
    prompts = [session.target.encode_prompt(t, chat=False) for t in TEXTS]
    rows = [decoder.add(p, m, seed) for p, m, seed in zip(prompts, MAX_TOKENS, seeds)]
    while decoder.rows:
        report = decoder.step()
        if events is not None:
            events += [e for s in report.rows for e in s.events]
    assert (sum(row.drafted for row in rows) > 0) == (session.drafter.name != "none")
    return [row.output for row in rows]


def _alone(session: Session, seed: int, text: str, max_tokens: int) -> list[int]:
    """The CLI pipeline's tokens for this request alone (the session's own drafter, budget and sampler)."""
    session.sampler.seed = seed
    ids = session.target.encode_prompt(text, chat=False)
    final = list(session.generate(ids, max_tokens))[-1]
    assert isinstance(final, RunFinished)
    return list(final.token_ids)


@pytest.mark.parametrize("draft", list(DRAFTS))
def test_greedy_rows_equal_draft_none_alone(arch, head, draft):
    plain = _session(arch, "none", head, sampled=False)
    want = [_alone(plain, 0, t, m) for t, m in zip(TEXTS, MAX_TOKENS)]
    got = _batched(_session(arch, draft, head, sampled=False), [0, 0, 0, 0])
    assert got == want


@pytest.mark.parametrize("draft", list(DRAFTS))
def test_sampled_rows_equal_the_same_seed_alone(arch, head, draft):
    seeds = [3, 11, 7, 5]
    session = _session(arch, draft, head, sampled=True)
    got = _batched(session, seeds)
    want = [_alone(session, s, t, m) for s, t, m in zip(seeds, TEXTS, MAX_TOKENS)]
    assert got == want
    assert len({tuple(g) for g in got}) == len(got)  # the seeds matter: four different answers


@pytest.mark.parametrize(
    "arch, draft",
    [
        ("qwen3_next", "ngram"),  # Gated DeltaNet + attention: each row's recurrent state kept at its accepted column
        ("qwen3_next", "model"),
        ("gemma3_text", "ngram"),  # sliding-window layers
        ("gemma3_text", "layerskip"),
        ("mamba2", "model"),  # recurrent only: no KV columns at all
    ],
)
def test_hybrid_recurrent_and_sliding_window_rows(arch, draft):
    plain = _session(arch, "none", "", sampled=False)
    want = [_alone(plain, 0, t, m) for t, m in zip(TEXTS, MAX_TOKENS)]
    assert _batched(_session(arch, draft, "", sampled=False), [0, 0, 0, 0]) == want
    seeds = [3, 11, 7, 5]
    session = _session(arch, draft, "", sampled=True)
    got = _batched(session, seeds)
    assert got == [_alone(session, s, t, m) for s, t, m in zip(seeds, TEXTS, MAX_TOKENS)]


@pytest.mark.parametrize(
    "arch, draft",
    [("llama", "ngram"), ("llama", "model"), ("llama", "lookahead"), ("llama", "mtp"), ("gemma3_text", "ngram")],
)
def test_tree_rows_in_a_batch(arch, draft, tmp_path):
    """tree=dynamic rows: each row's nodes at its offset + depth under its ancestor mask inside the batch's
    mask, its root and path kept by the commit; trees really branch, answers as alone."""
    head = ""
    if draft == "mtp":
        target = Session(_cfg(["model=tiny-random", f"model.arch={arch}", "draft=none"])).target
        module, _ = new_head(target.hidden_parts()[0])
        save_head(module, tmp_path, {"target": {"name": target.info.name, "sha256": target.info.sha256}})
        head = str(tmp_path)
    DRAFTS["lookahead"] = ["draft=lookahead"]  # trees only
    try:
        tree = ["tree=dynamic"]
        plain = _session(arch, "none", head, sampled=False)
        want = [_alone(plain, 0, t, m) for t, m in zip(TEXTS, MAX_TOKENS)]
        events: list = []
        assert _batched(_tree_session(arch, draft, head, False, tree), [0, 0, 0, 0], events) == want
        parents = [e.tree_parents for e in events if isinstance(e, Drafted) and e.tree_parents]
        branched = any(p != list(range(-1, len(p) - 1)) for p in parents)
        assert branched or (arch, draft) == ("llama", "ngram"), "no tree branched"  # its matches never fork here
        seeds = [3, 11, 7, 5]
        session = _tree_session(arch, draft, head, True, tree)
        got = _batched(session, seeds)
        assert got == [_alone(session, s, t, m) for s, t, m in zip(seeds, TEXTS, MAX_TOKENS)]
    finally:
        DRAFTS.pop("lookahead", None)


def _tree_session(arch: str, draft: str, head: str, sampled: bool, tree: list[str]) -> Session:
    extra = [f"draft.head={head}"] if draft == "mtp" else []
    sampling = ["sampling=sample", "sampling.temperature=1.0"] if sampled else []
    return Session(_cfg(["model=tiny-random", f"model.arch={arch}", *DRAFTS[draft], *extra, *sampling, *tree]))
