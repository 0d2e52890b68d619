"""The server's `/metrics`: counters, gauges and latency histograms through `prometheus_client`.

Contract: the worker thread and the HTTP layer call `count`, `set`, `observe`, `emitted`;
`value` reads a counter or gauge back; `render()` returns the exposition text (`CONTENT_TYPE`).
`Metrics(store)` also exposes the session's prefix store (`STORE_HELP`: hits, misses, tokens reused,
evictions, bytes and entries held), read from its `stats` at each scrape, so nothing counts twice;
`Metrics(store, history)` the draft=suffix history's tokens and requests held (`HISTORY_HELP`), likewise.
Each `Metrics` has its own registry (a test may hold several); thread-safe (prometheus_client's
locks). The metric names and help texts are the API dashboards read: keep them stable. No HTTP.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RATE_WINDOW_S = 10.0  # tok/s is the tokens emitted over the last 10 s
CONTENT_TYPE = prometheus_client.CONTENT_TYPE_PLAIN_0_0_4  # what every Prometheus version scrapes

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
    "specpipe_ttft_seconds": ("histogram", "Time to first token: request queued (prompt read) to first token."),
    "specpipe_inter_token_seconds": ("histogram", "Gap between a request's consecutive steps that emitted tokens."),
    "specpipe_request_seconds": ("histogram", "Request received to last token."),
}
LABELS = {"specpipe_requests_total": ("status",)}
# the prefix store's figures (specpipe/prefix/store.py StoreStats field -> metric)
STORE_HELP = {
    "specpipe_prefix_cache_hits_total": ("counter", "hits", "Prompts that started from a stored prefix."),
    "specpipe_prefix_cache_misses_total": ("counter", "misses", "Prompts that found no stored prefix."),
    "specpipe_prefix_cache_tokens_reused_total": (
        "counter",
        "tokens_reused",
        "Prompt tokens taken from the prefix store instead of prefilled.",
    ),
    "specpipe_prefix_cache_evictions_total": (
        "counter",
        "evictions",
        "Stored prefixes dropped to keep within prefix_cache.bytes (least recently used first).",
    ),
    "specpipe_prefix_cache_bytes": ("gauge", "bytes_held", "Bytes of cache snapshots the prefix store holds."),
    "specpipe_prefix_cache_entries": ("gauge", "entries", "Prefixes the prefix store holds."),
}

# draft=suffix's history of earlier requests (drafters/suffix_store.py HistoryShelf attribute -> metric)
HISTORY_HELP = {
    "specpipe_suffix_history_tokens": ("tokens", "Tokens of requests draft=suffix holds (<= draft.store_tokens)."),
    "specpipe_suffix_history_sequences": ("sequences", "Requests (prompt and answer) draft=suffix's history holds."),
}

prometheus_client.disable_created_metrics()  # *_created timestamps per series: noise for this server


class StoreCollector(Collector):
    """The prefix store's `stats`, read at each scrape (the store keeps the counts; nothing is copied)."""

    def __init__(self, store):
        self.store = store

    def collect(self):
        stats = self.store.stats
        for name, (kind, field, text) in STORE_HELP.items():
            if kind == "counter":  # prometheus_client adds the _total suffix itself
                yield CounterMetricFamily(name.removesuffix("_total"), text, value=getattr(stats, field))
            else:
                yield GaugeMetricFamily(name, text, value=getattr(stats, field))


class HistoryCollector(Collector):
    """draft=suffix's history (the session's HistoryShelf), read at each scrape; nothing while it holds no store."""

    def __init__(self, history):
        self.history = history

    def collect(self):
        if self.history.stores:
            for name, (field, text) in HISTORY_HELP.items():
                yield GaugeMetricFamily(name, text, value=getattr(self.history, field))


class Metrics:
    def __init__(self, prefix_store=None, history=None):
        """`prefix_store`: the session's (its figures join the exposition); None: the store is off. `history`:
        the session's HistoryShelf (draft=suffix's earlier requests)."""
        self.registry = CollectorRegistry(auto_describe=True)
        self._metrics: dict = {}
        for name, (kind, text) in HELP.items():
            labels = LABELS.get(name, ())
            if kind == "counter":  # prometheus_client adds the _total suffix itself
                self._metrics[name] = Counter(name.removesuffix("_total"), text, labels, registry=self.registry)
            elif kind == "gauge":
                self._metrics[name] = Gauge(name, text, labels, registry=self.registry)
            else:
                self._metrics[name] = Histogram(name, text, labels, buckets=LATENCY_BUCKETS, registry=self.registry)
        if prefix_store is not None:
            self.registry.register(StoreCollector(prefix_store))
        if history is not None:
            self.registry.register(HistoryCollector(history))
        self._lock = threading.Lock()
        self._recent: deque[tuple[float, int]] = deque()

    def _series(self, name: str, labels: dict):
        metric = self._metrics[name]
        return metric.labels(**labels) if labels else metric

    def count(self, name: str, value: float = 1.0, **labels) -> None:
        if value:
            self._series(name, labels).inc(value)

    def set(self, name: str, value: float) -> None:
        self._metrics[name].set(float(value))

    def observe(self, name: str, seconds: float) -> None:
        self._metrics[name].observe(seconds)

    def value(self, name: str, **labels) -> float:
        """A counter's or gauge's current value (0 for a series never touched)."""
        return self.registry.get_sample_value(name, labels or None) or 0.0

    def emitted(self, tokens: int) -> None:
        """Tokens sent to clients now (the tok/s gauge and the generated counter)."""
        with self._lock:
            self._recent.append((time.monotonic(), tokens))
        self.count("specpipe_generated_tokens_total", tokens)

    def render(self) -> str:
        with self._lock:
            now = time.monotonic()
            while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
                self._recent.popleft()
            rate = sum(t for _, t in self._recent) / RATE_WINDOW_S
        self.set("specpipe_tokens_per_second", rate)
        return generate_latest(self.registry).decode()
