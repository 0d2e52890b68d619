"""Acceptance of n-gram drafts by the length of their match (the evidence class budget=auto sizes drafts by).

python scripts/ngram_match_acceptance.py suite=code limit=12 max_tokens=96 budget=fixed budget.k=16
"""

from specpipe.engine.load.blas import preload_blas

preload_blas()

import collections
import sys

from hydra import compose, initialize_config_module

import specpipe.config  # noqa: F401  (registers the config schemas)
from specpipe.bench.harness import _shared_target, session_config
from specpipe.bench.records import load_suite
from specpipe.events import Drafted, Verified
from specpipe.session import Session


def main() -> None:
    with initialize_config_module("specpipe.conf", version_base=None):
        cfg = compose("bench", overrides=sys.argv[1:])
    spec = Session(session_config(cfg, cfg.draft), target=_shared_target(cfg))
    drafts: dict[int, list[int]] = collections.defaultdict(list)  # match length -> accepted per draft
    for prompt in load_suite(cfg.suite.name, cfg.suite.path, cfg.limit):
        ids = spec.target.encode_prompt(prompt["prompt"], cfg.suite.chat, cfg.suite.system)
        match = None
        for event in spec.generate(ids, max_tokens=cfg.max_tokens):
            if isinstance(event, Drafted) and event.draft_ids:
                match = spec.drafter.last_evidence
            elif isinstance(event, Verified) and match is not None:
                drafts[match].append(len(event.accepted_ids))
                match = None
    print("| matched suffix | drafts | first token accepted | tokens accepted per draft |\n|---|---|---|---|")
    for n in sorted(drafts):
        a = drafts[n]
        print(f"| {n} | {len(a)} | {sum(x > 0 for x in a) / len(a):.0%} | {sum(a) / len(a):.2f} |")


if __name__ == "__main__":
    main()
