"""The schema of `conf/serve.yaml`: the pipeline groups plus where and how to listen.

Types only (`MISSING`): every value lives in conf/serve.yaml, one source per default
(tests/test_plugins.py checks every schema module)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from specpipe.config.schema import PipelineGroups, PromptConfig


@dataclass
class ServeConfig(PipelineGroups):
    prompt: PromptConfig = field(default_factory=PromptConfig)  # chat template use; text unused
    host: str = MISSING  # a non-loopback host needs allow_remote and an api_key
    allow_remote: bool = MISSING  # true: listen beyond this machine; every request then needs the key
    api_key: str | None = MISSING  # Bearer token clients must send (else env SPECPIPE_API_KEY); never logged
    allowed_origins: list[str] = MISSING  # web pages allowed to call the API from a browser (CORS)
    port: int = MISSING  # 0: any free port
    max_tokens: int = MISSING  # a request's default
    max_tokens_limit: int = MISSING  # the most a request may ask for
    max_batch: int = MISSING  # requests decoded together; 1: one at a time
    max_queue: int = MISSING  # waiting requests beyond this get 429
    prefill_per_step: int = MISSING  # prompt tokens of joining requests prefilled between two decode steps
    prefix_wait_tokens: int = MISSING  # a prompt sharing this many leading tokens with a joining one waits for it
    shutdown_grace_s: float = MISSING  # after SIGTERM, in-flight responses get this long to be written
    keep_alive_s: float = MISSING  # an idle kept-alive connection closes after this long
    access_log: bool = MISSING  # one line per request on the console (method, path, status, id, tokens, time)
    stream: bool = MISSING  # unused by the server (kept for the Session's config view)


ConfigStore.instance().store(name="serve_schema", node=ServeConfig)
