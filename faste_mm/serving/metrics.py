"""Serving metrics in the Prometheus text exposition format (version 0.0.4), without a client
library: counters, gauges and cumulative histograms with labels, rendered by `render()`.

Receives observations from the HTTP layer (requests, latency) and the batcher (batch sizes,
tokens in and kept, queue depth); hands back the text `GET /metrics` serves.
"""

from __future__ import annotations

import bisect
import math
import threading
from dataclasses import dataclass, field

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536)

Labels = tuple[tuple[str, str], ...]


@dataclass(slots=True)
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0
    largest: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.buckets, value)  # bucket le >= value
        if index < len(self.counts):
            self.counts[index] += 1
        self.total += value
        self.n += 1
        self.largest = max(self.largest, value)


class Metrics:
    """Thread-safe registry of the server's metrics (one per app, no global state)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, dict[Labels, float]] = {}
        self._gauges: dict[str, dict[Labels, float]] = {}
        self._histograms: dict[str, dict[Labels, _Histogram]] = {}
        self._help: dict[str, tuple[str, str]] = {}  # name -> (type, help)

    def describe(self, name: str, kind: str, help_text: str) -> None:
        self._help[name] = (kind, help_text)

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        with self._lock:
            series = self._counters.setdefault(name, {})
            key = _key(labels)
            series[key] = series.get(key, 0.0) + value

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self._gauges.setdefault(name, {})[_key(labels)] = value

    def observe(self, name: str, value: float, buckets: tuple[float, ...], **labels: str) -> None:
        with self._lock:
            series = self._histograms.setdefault(name, {})
            key = _key(labels)
            if key not in series:
                series[key] = _Histogram(buckets)
            series[key].observe(value)

    def largest(self, name: str, **labels: str) -> float:
        """Largest value a histogram has seen (0 when none); for tests and /info."""
        with self._lock:
            histogram = self._histograms.get(name, {}).get(_key(labels))
            return 0.0 if histogram is None else histogram.largest

    def render(self) -> str:
        """The whole registry as Prometheus text."""
        lines: list[str] = []
        with self._lock:
            for name, series in sorted(self._counters.items()):
                self._header(lines, name, "counter")
                lines += [f"{name}{_labels(key)} {_number(value)}" for key, value in sorted(series.items())]
            for name, series in sorted(self._gauges.items()):
                self._header(lines, name, "gauge")
                lines += [f"{name}{_labels(key)} {_number(value)}" for key, value in sorted(series.items())]
            for name, series in sorted(self._histograms.items()):
                self._header(lines, name, "histogram")
                for key, histogram in sorted(series.items()):
                    cumulative = 0
                    for bound, count in zip(histogram.buckets, histogram.counts):
                        cumulative += count
                        lines.append(f"{name}_bucket{_labels(key + (('le', _number(bound)),))} {cumulative}")
                    lines.append(f"{name}_bucket{_labels(key + (('le', '+Inf'),))} {histogram.n}")
                    lines.append(f"{name}_sum{_labels(key)} {_number(histogram.total)}")
                    lines.append(f"{name}_count{_labels(key)} {histogram.n}")
        return "\n".join(lines) + "\n"

    def _header(self, lines: list[str], name: str, kind: str) -> None:
        kind, help_text = self._help.get(name, (kind, name))
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")


def _key(labels: dict[str, str]) -> Labels:
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


def _labels(key: Labels) -> str:
    if not key:
        return ""
    escaped = (v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') for _, v in key)
    return "{" + ",".join(f'{k}="{v}"' for (k, _), v in zip(key, escaped)) + "}"


def _number(value: float) -> str:
    if isinstance(value, float) and math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def describe_server_metrics(metrics: Metrics) -> Metrics:
    """Register the HELP texts of the metrics the server emits."""
    for name, kind, text in (
        ("faste_mm_requests_total", "counter", "HTTP requests by route and status code"),
        ("faste_mm_request_seconds", "histogram", "HTTP request latency in seconds by route"),
        ("faste_mm_batch_size", "histogram", "requests merged into one model call, by kind"),
        ("faste_mm_batch_items", "histogram", "items (rows) embedded in one model call, by kind"),
        ("faste_mm_tokens_in_total", "counter", "prompt tokens embedded, by kind"),
        ("faste_mm_prefix_tokens_total", "counter", "prefix tokens entering the decoder, by kind"),
        ("faste_mm_prefix_tokens_kept_total", "counter", "prefix tokens kept after FastE, by kind"),
        ("faste_mm_queue_depth", "gauge", "requests waiting for the model, by kind"),
        ("faste_mm_rejected_total", "counter", "requests refused with 503 because a queue was full"),
    ):
        metrics.describe(name, kind, text)
    return metrics
