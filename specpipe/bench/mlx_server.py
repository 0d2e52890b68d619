"""mlx-lm's own server as a bench anchor, on exactly the weights specpipe runs.

Contract: `model_folder(engine)` writes a loaded target Engine as an mlx-lm model folder (its weights at the
precision specpipe loaded them, config.json, the tokenizer with its chat template) under the cache folder, once
per weights hash and precision, and returns its path; `MlxLmServer(folder, ...)` is a context manager running
`mlx_lm server` on 127.0.0.1 (a free port, greedy, its LRU prompt cache on) until the block ends, with the BLAS
and thread count specpipe's own processes load (`python -m specpipe.bench.mlx_server THREADS ARGS...` preloads
them, then runs mlx-lm's unchanged `server.main`). It never reaches beyond the loopback and stops the child it
started, and only that one.
"""

from __future__ import annotations

import dataclasses
import http.client
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START_TIMEOUT_S = 120.0


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specpipe" / "mlx_lm_folders"


def model_folder(engine, root: Path | None = None) -> Path:
    """The engine's model as an mlx-lm folder (written through a temporary folder and a rename, so a cut
    write never looks finished); reused when it exists."""
    from mlx_lm.utils import save_config, save_model

    info = engine.info
    folder = (root or cache_root()) / f"{info.name}-{info.precision}-{info.sha256[:16]}"
    if (folder / "config.json").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    try:
        save_model(tmp, engine.model)
        config = dataclasses.asdict(engine.model.args)
        save_config({**config, "eos_token_id": list(engine.tokenizer.eos_token_ids)}, tmp / "config.json")
        engine.tokenizer._tokenizer.save_pretrained(str(tmp))  # the HF tokenizer, its chat template included
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlxLmServer:
    """`mlx_lm server --model folder` on 127.0.0.1; `.port` once started. Its log goes to `log_path`."""

    def __init__(
        self, folder: Path, max_tokens: int, log_path: Path, threads: int, prompt_cache_bytes: int | None = None
    ):
        self.folder, self.max_tokens, self.log_path, self.threads = folder, max_tokens, log_path, threads
        self.prompt_cache_bytes = prompt_cache_bytes
        self.port = 0
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> MlxLmServer:
        self.port = free_port()
        cmd = [sys.executable, "-m", "specpipe.bench.mlx_server", str(self.threads), "--model", str(self.folder)]
        cmd += ["--host", "127.0.0.1"]
        cmd += ["--port", str(self.port), "--temp", "0", "--max-tokens", str(self.max_tokens)]
        if self.prompt_cache_bytes is not None:
            cmd += ["--prompt-cache-bytes", str(self.prompt_cache_bytes)]
        self._log = open(self.log_path, "w", encoding="utf-8")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.__exit__(None, None, None)
                raise RuntimeError(f"mlx_lm server exited at start (code {self.proc.returncode}); see {self.log_path}")
            if _healthy(self.port):
                return self
            time.sleep(0.5)
        self.__exit__(None, None, None)
        raise RuntimeError(f"mlx_lm server did not answer /health within {START_TIMEOUT_S:.0f} s; see {self.log_path}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _healthy(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/health")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def _serve(argv: list[str]) -> None:
    """The child: specpipe's BLAS preloaded with `argv[0]` threads, then mlx-lm's server on the rest."""
    from specpipe.engine.load.blas import blas_phrase, preload_blas

    info = preload_blas(threads=int(argv[0]))
    print(f"mlx_lm server under {blas_phrase(info)}", flush=True)
    from mlx_lm.server import main

    sys.argv = ["mlx_lm.server", *argv[1:]]
    main()


if __name__ == "__main__":
    _serve(sys.argv[1:])
