"""What the model suite measures (its options and table: `model_suite`): FastE end to end against the full forward on the same inputs, in
the same process and order: items/s, tokens/s, forward and end-to-end time (median, min-max over
repeats after a warm-up), peak memory, realised removal, FLOPs reduction, FLOPs-implied speedup,
measured speedups and the realisation ratio; optionally against a plain HF forward and
sentence-transformers.
"""

from __future__ import annotations

import ctypes
import os
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from faste_mm.model.cpu.machine import device_name
from faste_mm.model.batching import UNPADDED_MODES, BatchingConfig
from faste_mm.model.faste import FastEConfig
from faste_mm.model.flops import tower_share
from faste_mm.model.embedder import EmbedResult, Embedder, EmbedStats
from faste_mm.errors import ConfigError, InputError
from faste_mm.model.items import Item, as_item
from faste_mm.model.patch_dedup import PatchDedupConfig

if TYPE_CHECKING:  # annotations only: importing faste_mm.datasets loads the hub and parquet readers
    from faste_mm.datasets.encoding import ProgressSink

COMPARISONS = ("hf", "sentence-transformers")


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """r_max 0 is the full forward, always measured first as the baseline. fast_e: the FastE
    settings every measured ratio shares (l_w, theta, trigger layer; its r_max is replaced by each
    of `r_max`). `unpadded` lists the layouts for the layers after compression; with more than
    one, every FastE setting runs once per layout (named "faste r=0.5 [off]", ...), all against
    the same full forward. patch_dedup: duplicate-patch removal on every run, the baseline's too
    (None: off; `faste-mm bench patch-dedup` measures it against off)."""

    r_max: tuple[float, ...] = (0.0, 0.3, 0.5, 0.7)
    unpadded: tuple[str, ...] = ("auto",)
    fast_e: FastEConfig = FastEConfig(r_max=0.0)
    repeats: int = 3
    compare: tuple[str, ...] = ()
    compare_batch_size: int = 8
    roofline: bool = True  # measure the GEMM rates and the FastE check's cost first (tools/roofline.py)
    patch_dedup: PatchDedupConfig | None = None

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ConfigError(f"BenchConfig.repeats must be >= 1, got {self.repeats}")
        unknown = set(self.compare) - set(COMPARISONS)
        if unknown:
            raise ConfigError(f"BenchConfig.compare: unknown {sorted(unknown)}; valid: {', '.join(COMPARISONS)}")
        for r in self.r_max:
            FastEConfig(r_max=r)  # validates the range with the field's own message
        if not self.unpadded:
            raise ConfigError(f"BenchConfig.unpadded: give at least one of {', '.join(UNPADDED_MODES)}")
        for mode in self.unpadded:
            BatchingConfig(unpadded=mode)  # validates with the field's own message


@dataclass(frozen=True, slots=True)
class Timing:
    median: float
    min: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> "Timing":
        return cls(statistics.median(values), min(values), max(values))


@dataclass(frozen=True, slots=True)
class SettingResult:
    name: str
    r_max: float | None
    items: int
    tokens: int
    forward_s: Timing
    e2e_s: Timing
    peak_memory_bytes: int
    prefix_removal: float = 0.0
    flops_reduction: float = 0.0
    mean_trigger_layer: float | None = None
    flops_implied_speedup: float = 1.0
    forward_speedup: float = 1.0
    e2e_speedup: float = 1.0
    realisation: float = 1.0  # measured forward speedup / FLOPs-implied speedup
    # images and pages: the vision tower's share of the full forward's FLOPs, and the implied
    # speedup and realisation of the whole forward (decoder + the tower FastE leaves alone)
    vision_flops_share: float = 0.0
    flops_implied_speedup_with_vision: float = 1.0
    realisation_with_vision: float = 1.0
    e2e_over_forward: float = 1.0  # e2e speedup / forward speedup
    max_abs_diff_vs_full: float = 0.0
    # the two stages of the forward, medians over the repeats (seconds); shares of tower + decoder
    tower_s: float = 0.0
    decoder_s: float = 0.0
    tower_time_share: float = 0.0
    tower_flops_share: float = 0.0  # of the FLOPs this setting realised (decoder after FastE + tower)
    unpadded: str | None = None  # the requested layout after compression (FastE settings)
    attention: dict = field(default_factory=dict)  # batches per layout actually used
    attention_trial: dict = field(default_factory=dict)  # the "auto" trial's seconds per option
    roofline: dict = field(default_factory=dict)  # stage -> roofline.StageRate.to_dict()
    checks: int = 0  # FastE's alignment checks in one run (monitored layers over all batches)
    # (decoder_s - the full forward's) / checks: the check's cost per monitored layer where the
    # trigger never fires before the last layer (there only the fallback's one compressed layer differs)
    decoder_s_per_check: float | None = None

    @property
    def items_per_s(self) -> float:
        return self.items / self.e2e_s.median

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.e2e_s.median

    def to_dict(self) -> dict:
        return {**asdict(self), "items_per_s": self.items_per_s, "tokens_per_s": self.tokens_per_s}


@dataclass(frozen=True, slots=True)
class BenchReport:
    device: str
    model: str
    inputs: str
    memory_kind: str  # "cuda_allocated", "heap_allocated" (CPU, glibc) or "rss"
    settings: list[SettingResult] = field(default_factory=list)
    batching: dict = field(default_factory=dict)  # BatchingConfig fields + the worker threads used
    dtype: dict = field(default_factory=dict)  # DtypeChoice.to_dict(): what faste-mm ran in, and why
    matmul_rates: dict = field(default_factory=dict)  # dtype -> roofline.MatmulRate.to_dict()
    check_cost: dict = field(default_factory=dict)  # check_cost.CheckCost.to_dict()
    kernels: list = field(default_factory=list)  # kernel_choice verdicts in words

    def to_dict(self) -> dict:
        return {
            "device": self.device,
            "dtype": self.dtype,
            "matmul_rates": self.matmul_rates,
            "check_cost": self.check_cost,
            "kernels": self.kernels,
            "model": self.model,
            "inputs": self.inputs,
            "memory_kind": self.memory_kind,
            "batching": self.batching,
            "settings": [s.to_dict() for s in self.settings],
        }


def flops_implied_speedup(reduction: float) -> float:
    """1 / (1 - reduction): the speedup if time were proportional to decoder FLOPs."""
    return 1.0 / (1.0 - reduction)


def run_bench(embedder: Embedder, inputs: list, config: BenchConfig, inputs_label: str,
              progress: ProgressSink | None = None) -> BenchReport:
    """Measure every r_max (0 first, once) under every unpadded layout, then the comparisons,
    on the same inputs. progress: one phase per setting, advanced after each run (the warm-up
    and the timed repeats)."""
    device = embedder.backbone.device
    rates, check = {}, None
    if config.roofline:  # before anything else warms or fragments the allocator
        from faste_mm.tools.check_cost import measure_check_cost
        from faste_mm.tools.roofline import measure_rates

        rates = measure_rates(device, (embedder.dtype_choice.name,))  # only the dtype the stages are read against
        check = measure_check_cost(embedder, inputs)
    roof = (embedder.dtype_choice.name, rates)
    # comparison encoders first: an input or install they refuse must not cost the timed runs
    comparisons = {
        name: (_hf_forward if name == "hf" else _sentence_transformers_forward)(embedder, inputs, config.compare_batch_size)
        for name in config.compare
    }
    settings: list[SettingResult] = []
    dedup = config.patch_dedup
    full, full_vectors = _measure("full", 0.0, lambda: _Run.of(embedder.encode_documents(inputs, patch_dedup=dedup)), config.repeats, device,
                                  progress=progress, roof=roof)
    settings.append(full)
    for mode in config.unpadded:
        layout = embedder.with_batching(replace(embedder.batching, unpadded=mode))
        for r_max in sorted(set(config.r_max) - {0.0}):
            fast_e = replace(config.fast_e, r_max=r_max)
            name = f"faste r={r_max:g}" + (f" [{mode}]" if len(config.unpadded) > 1 else "")
            result, vectors = _measure(
                name, r_max, lambda: _Run.of(layout.encode_documents(inputs, fast_e=fast_e, patch_dedup=dedup)), config.repeats, device, mode,
                progress, roof
            )
            settings.append(_relative_to(result, full, np.abs(vectors - full_vectors).max()))
    for comparison, encode in comparisons.items():
        result, vectors = _measure(comparison, None, encode, config.repeats, device, progress=progress)
        settings.append(_relative_to(result, full, np.abs(vectors - full_vectors).max()))
    memory_kind = "cuda_allocated" if device.type == "cuda" else cpu_memory_kind()
    batching = {**asdict(embedder.batching), "worker_threads": embedder.batching.worker_threads}
    return BenchReport(device_name(device), embedder.model_id, inputs_label, memory_kind, settings, batching,
                       embedder.dtype_choice.to_dict(), {k: r.to_dict() for k, r in rates.items()},
                       check.to_dict() if check is not None else {}, embedder.kernel_choices())


@dataclass(frozen=True, slots=True)
class _Run:
    """One timed encode as `_measure` reads it: faste-mm's (with its stats) or a comparison's."""

    embeddings: np.ndarray
    forward_s: float
    items: int
    tokens: int  # prefix + readout tokens
    stats: EmbedStats | None = None
    tower_s: float | None = None  # a comparison's vision tower seconds, where it has one

    @classmethod
    def of(cls, result: EmbedResult) -> "_Run":
        stats = result.stats
        tokens = stats.prefix_tokens + sum(t.batch_size for t in stats.batches)
        return cls(result.embeddings, stats.forward_s, stats.n_items - stats.n_failed, tokens, stats)


def _measure(name, r_max, encode: Callable[[], _Run], repeats, device, unpadded=None,
             progress: ProgressSink | None = None, roof=("", {})) -> tuple[SettingResult, np.ndarray]:
    if progress is not None:
        progress.start(f"bench {name} (warm-up + {repeats} runs)", 1 + repeats)
    encode()  # warm-up: kernels, allocator, tokenizer caches
    if progress is not None:
        progress.advance(1)
    forward, e2e, tower, decoder = [], [], [], []
    with _PeakMemory(device) as memory:
        for _ in range(repeats):
            started = time.perf_counter()
            run = encode()
            e2e.append(time.perf_counter() - started)
            forward.append(run.forward_s)
            if run.stats is not None:
                tower.append(run.stats.tower_s)
                decoder.append(run.stats.decoder_s)
            if progress is not None:
                progress.advance(1)
    compression = {}
    if (stats := run.stats) is not None:
        compression = dict(
            prefix_removal=stats.prefix_removal,
            flops_reduction=stats.flops_reduction,
            mean_trigger_layer=stats.mean_trigger_layer,
            flops_implied_speedup=flops_implied_speedup(stats.flops_reduction),
            vision_flops_share=stats.flops_vision / (stats.flops_full + stats.flops_vision) if stats.flops_vision else 0.0,
            flops_implied_speedup_with_vision=flops_implied_speedup(stats.flops_reduction_with_vision),
            attention=stats.attention,
            attention_trial=stats.attention_trial,
            tower_s=statistics.median(tower),
            decoder_s=statistics.median(decoder),
            tower_time_share=tower_share(statistics.median(tower), statistics.median(decoder)),
            tower_flops_share=stats.tower_flops_share,
            roofline=_roofline(stats, statistics.median(tower), statistics.median(decoder), *roof),
            checks=sum(len(trace.alignment) for trace in stats.batches),
        )
    setting = SettingResult(
        name=name,
        r_max=r_max,
        items=run.items,
        tokens=run.tokens,
        forward_s=Timing.of(forward),
        e2e_s=Timing.of(e2e),
        peak_memory_bytes=memory.peak,
        unpadded=unpadded,
        **compression,
    )
    return setting, run.embeddings


def _roofline(stats: EmbedStats, tower_s: float, decoder_s: float, dtype: str, rates: dict) -> dict:
    """Per stage: the FLOPs this run realised over its median seconds, against the GEMM rate."""
    from faste_mm.tools.roofline import stage_rates

    stages = {"tower": (stats.flops_vision, tower_s), "decoder": (stats.flops_realised, decoder_s)}
    return {name: rate.to_dict() for name, rate in stage_rates(stages, dtype, rates).items()}


def _relative_to(result: SettingResult, full: SettingResult, max_abs_diff: float) -> SettingResult:
    forward_speedup = full.forward_s.median / result.forward_s.median
    e2e_speedup = full.e2e_s.median / result.e2e_s.median
    return replace(
        result,
        forward_speedup=forward_speedup,
        e2e_speedup=e2e_speedup,
        realisation=forward_speedup / result.flops_implied_speedup,
        realisation_with_vision=forward_speedup / result.flops_implied_speedup_with_vision,
        e2e_over_forward=e2e_speedup / forward_speedup,
        max_abs_diff_vs_full=float(max_abs_diff),
        decoder_s_per_check=(result.decoder_s - full.decoder_s) / result.checks if result.checks else None,
    )


class _PeakMemory:
    """Peak CUDA allocated memory; on CPU, peak live heap bytes (glibc mallinfo2) sampled every
    5 ms. RSS is not used: freed memory stays in the process, so later settings would inherit
    earlier settings' peaks. Falls back to RSS where mallinfo2 is missing (non-glibc)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "_PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self._stop.set()
            self._thread.join()

    def _sample(self) -> None:
        read = _heap_allocated if cpu_memory_kind() == "heap_allocated" else _rss
        while not self._stop.is_set():
            self.peak = max(self.peak, read())
            self._stop.wait(0.005)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"
    )]


def _libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def cpu_memory_kind() -> str:
    return "heap_allocated" if _LIBC is not None else "rss"


def _heap_allocated() -> int:
    info = _LIBC.mallinfo2()
    return info.uordblks + info.hblkhd  # bytes in use from the heap + in mmap'd large blocks


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hf_forward(embedder: Embedder, inputs: list, batch_size: int):
    """A plain HF forward as the official embedders run it: input order, fixed batch size,
    padding, the model's own forward, last valid token of last_hidden_state."""
    serializer, model = embedder.serializer, embedder.backbone.model
    items = [as_item(value, position) for position, value in enumerate(inputs)]
    if any(item.is_pdf for item in items):
        raise InputError("--compare hf takes texts and images; PDF pages are expanded only by faste-mm")

    tower = _TimedModule(getattr(getattr(model, "model", model), "visual", None))

    def encode() -> _Run:
        vectors, forward_s, tokens = [], 0.0, 0
        tower.seconds = 0.0
        for start in range(0, len(items), batch_size):
            chunk = items[start : start + batch_size]
            prompts = [serializer.render_prompt(item, item.instruction) for item in chunk]
            if hasattr(serializer, "processor"):
                images = [serializer.prepare_image(item) for item in chunk if item.has_image] or None
                batch = serializer.processor(text=prompts, images=images, do_resize=False, padding=True, return_tensors="pt")
            else:
                eos = serializer.tokenizer.eos_token if serializer.prompt.readout == "eos" else ""
                batch = serializer.tokenizer([p + eos for p in prompts], padding=True, return_tensors="pt")
            batch = batch.to(embedder.backbone.device)
            tick = time.perf_counter()
            with torch.inference_mode():
                hidden = model(**batch).last_hidden_state
                last = batch["attention_mask"].sum(dim=1) - 1  # right padding
                pooled = torch.nn.functional.normalize(hidden[torch.arange(len(chunk)), last].float(), dim=-1).cpu()
            forward_s += time.perf_counter() - tick
            tokens += int(batch["attention_mask"].sum())
            vectors.append(pooled.numpy())
        return _Run(np.concatenate(vectors), forward_s, len(items), tokens,
                    tower_s=tower.seconds if tower.module is not None else None)

    return encode


class _TimedModule:
    """Seconds spent in `module`'s forward (transformers' vision tower inside its model's forward),
    summed by a pre- and a post-hook: the official path's tower beside faste-mm's own `tower_s`."""

    def __init__(self, module: torch.nn.Module | None) -> None:
        self.module, self.seconds, self._started = module, 0.0, 0.0
        if module is not None:
            module.register_forward_pre_hook(self._pre)
            module.register_forward_hook(self._post)

    def _pre(self, module, args) -> None:
        self._started = time.perf_counter()

    def _post(self, module, args, output) -> None:
        self.seconds += time.perf_counter() - self._started


def _sentence_transformers_forward(embedder: Embedder, inputs: list, batch_size: int):
    """The same texts through SentenceTransformer loaded from the same local directory."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise ConfigError("--compare sentence-transformers needs: pip install 'faste-mm[st]'") from None
    if hasattr(embedder.serializer, "processor") or not all(isinstance(v, str) for v in inputs):
        raise ConfigError("--compare sentence-transformers is implemented for text models and text inputs")
    if not (Path(embedder.model_id) / "modules.json").exists():
        raise ConfigError(f"{embedder.model_id}: no sentence-transformers layout (modules.json) to load")
    model = SentenceTransformer(embedder.model_id, device=str(embedder.backbone.device))
    serializer = embedder.serializer
    eos = serializer.tokenizer.eos_token if serializer.prompt.readout == "eos" else ""
    texts = [serializer.render_prompt(Item(text=text), None) + eos for text in inputs]
    tokens = sum(len(serializer.tokenizer(t)["input_ids"]) for t in texts)  # once, outside the timed runs

    def encode() -> _Run:
        tick = time.perf_counter()
        vectors = model.encode(texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True)
        elapsed = time.perf_counter() - tick
        return _Run(vectors.astype(np.float32), elapsed, len(texts), tokens)

    return encode
