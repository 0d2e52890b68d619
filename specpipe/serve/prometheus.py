"""The server's `/metrics`: counters, gauges and latency histograms in Prometheus' text format.

Contract: the worker thread and the HTTP threads call `count`, `set`, `observe`; `render()`
returns the exposition text (version 0.0.4). Thread-safe, no dependency, no HTTP.
"""

from __future__ import annotations

import threading
import time
from collections import deque

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RATE_WINDOW_S = 10.0  # tok/s is the tokens emitted over the last 10 s

HELP = {
    "specpipe_requests_total": (
        "counter",
        "Requests by outcome (ok, cancelled, error, rejected_queue_full, bad_request).",
    ),
    "specpipe_queue_length": ("gauge", "Requests waiting for a batch slot."),
    "specpipe_batch_size": ("gauge", "Rows decoded together in the latest step."),
    "specpipe_steps_total": ("counter", "Target forwards (steps) of the batch."),
    "specpipe_batch_rows_total": ("counter", "Rows summed over steps (divide by steps_total: mean batch size)."),
    "specpipe_draft_k": ("gauge", "Draft budget K of the latest step (0: plain decoding)."),
    "specpipe_drafted_tokens_total": ("counter", "Tokens proposed by the drafters."),
    "specpipe_accepted_tokens_total": ("counter", "Drafted tokens the target accepted."),
    "specpipe_generated_tokens_total": ("counter", "Tokens emitted to clients."),
    "specpipe_tokens_per_second": ("gauge", "Tokens emitted per second over the last 10 s, all requests."),
    "specpipe_ttft_seconds": ("histogram", "Time to first token: request received to first token decoded."),
    "specpipe_inter_token_seconds": ("histogram", "Gap between a request's consecutive steps that emitted tokens."),
    "specpipe_request_seconds": ("histogram", "Request received to last token."),
}


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self._values: dict[tuple[str, tuple], float] = {}
        self._hist: dict[str, list] = {}  # name -> [bucket counts..., +Inf count, sum]
        self._recent: deque[tuple[float, int]] = deque()

    def count(self, name: str, value: float = 1.0, **labels) -> None:
        with self._lock:
            key = (name, tuple(sorted(labels.items())))
            self._values[key] = self._values.get(key, 0.0) + value

    def set(self, name: str, value: float) -> None:
        with self._lock:
            self._values[(name, ())] = float(value)

    def observe(self, name: str, seconds: float) -> None:
        with self._lock:
            h = self._hist.setdefault(name, [0] * (len(LATENCY_BUCKETS) + 1) + [0.0])
            for i, bound in enumerate(LATENCY_BUCKETS):
                if seconds <= bound:
                    h[i] += 1
            h[len(LATENCY_BUCKETS)] += 1
            h[-1] += seconds

    def value(self, name: str, **labels) -> float:
        with self._lock:
            return self._values.get((name, tuple(sorted(labels.items()))), 0.0)

    def emitted(self, tokens: int) -> None:
        """Tokens sent to clients now (the tok/s gauge and the generated counter)."""
        now = time.monotonic()
        with self._lock:
            self._recent.append((now, tokens))
            key = ("specpipe_generated_tokens_total", ())
            self._values[key] = self._values.get(key, 0.0) + tokens

    def render(self) -> str:
        with self._lock:
            now = time.monotonic()
            while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
                self._recent.popleft()
            self._values[("specpipe_tokens_per_second", ())] = sum(t for _, t in self._recent) / RATE_WINDOW_S
            lines = []
            for name, (kind, text) in HELP.items():
                lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
                if kind == "histogram":
                    h = self._hist.get(name, [0] * (len(LATENCY_BUCKETS) + 1) + [0.0])
                    lines += [f'{name}_bucket{{le="{b}"}} {h[i]}' for i, b in enumerate(LATENCY_BUCKETS)]
                    lines += [
                        f'{name}_bucket{{le="+Inf"}} {h[len(LATENCY_BUCKETS)]}',
                        f"{name}_sum {h[-1]:.6f}",
                        f"{name}_count {h[len(LATENCY_BUCKETS)]}",
                    ]
                    continue
                series = [(labels, v) for (n, labels), v in self._values.items() if n == name] or [((), 0.0)]
                for labels, value in sorted(series):
                    tag = "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" if labels else ""
                    lines.append(f"{name}{tag} {value:g}")
            return "\n".join(lines) + "\n"
