"""The schema of `conf/serve.yaml`: the pipeline groups plus where and how to listen."""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from specpipe.config import PipelineGroups, PromptConfig


@dataclass
class ServeConfig(PipelineGroups):
    prompt: PromptConfig = field(
        default_factory=lambda: PromptConfig(text="", chat=True, system=None)
    )  # chat template use; text unused
    host: str = "127.0.0.1"  # loopback only unless asked (a non-loopback host needs allow_remote and an api_key)
    allow_remote: bool = False  # true: listen beyond this machine (host=0.0.0.0); every request then needs the key
    api_key: str | None = None  # Bearer token clients must send (else env SPECPIPE_API_KEY); never logged
    # web pages (origins, e.g. http://localhost:3000) allowed to call the API from a browser, with CORS headers
    allowed_origins: list[str] = field(default_factory=list)
    port: int = 8000  # 0: any free port (printed on start)
    max_tokens: int = 256  # a request's default; a request may ask for up to max_tokens_limit
    max_tokens_limit: int = 4096
    max_batch: int = 8  # requests decoded together (one target forward per step); 1: one at a time
    max_queue: int = 16  # requests waiting beyond this get 429 (retry later) instead of an unbounded wait
    # prompt tokens of joining requests prefilled between two decode steps while others decode
    # (0: whole prompts at once, stalling every active stream for the prefill). 1024: a burst of
    # chat-sized prompts still joins in about one step (256 cost throughput at 8 clients,
    # docs/benchmarks.md), while a long prompt no longer stalls the streams for its whole prefill
    prefill_per_step: int = 1024
    stream: bool = False  # unused by the server (kept for the Session's config view)


ConfigStore.instance().store(name="serve_schema", node=ServeConfig)
