"""`faste-mm plan`: the cheapest embedding setting that keeps search results the same, measured
on a sample of the user's own files.

A seeded sample, stratified by kind (photos, pages, texts, videos), is embedded once with the
reference setting (full forward, the official 1,843,200-pixel cap, float32) and once per candidate
(max_pixels x r_max x dtype), all with one model load: pixels and FastE are per-call settings,
another dtype is a cast copy of the weights. Fidelity is label-free (cosine to the reference
vector; neighbour agreement@k within the sample; with queries, their top-k agreement); cost is
measured on this device (seconds per item) and counted (FLOPs with the vision tower). Hands back a
`PlanReport` (faste_mm.tools.plan_report).
"""
# Size: ~470 lines: the sample, the candidates (pixels x r_max x dtype x patch dedup, int8 after its
# trial), the runs and the rows are one measurement read top to bottom; the report is its own module.

from __future__ import annotations

import copy
import datetime
import logging
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import numpy as np
import torch

from faste_mm.errors import ConfigError, InputError
from faste_mm.model.backbones.loading import DtypeChoice, choose_dtype, resolve_dtype
from faste_mm.model.embedder import EmbedResult, Embedder
from faste_mm.model.faste import FastEConfig
from faste_mm.model.file_decoding import count_pdf_pages
from faste_mm.model.items import Item, as_item, expand_items
from faste_mm.model.official import OFFICIAL_MAX_PIXELS, PIXEL_SWEEP
from faste_mm.model.patch_dedup import PatchDedupConfig, applies_to, dedup_config
from faste_mm.model.serialization import SerializerConfig, pixel_budget
from faste_mm.retrieval.decoders import document_input
from faste_mm.retrieval.estimate import KIND_NAMES, TokenBounds, plan_rows, seconds_per_item
from faste_mm.retrieval.scanning import ScanFilter, scan_paths
from faste_mm.model.cpu.machine import device_name
from faste_mm.tools.plan_report import CandidateResult, PlanReport, pareto_front, recommend

if TYPE_CHECKING:  # annotations only: importing faste_mm.datasets loads the hub and parquet readers
    from faste_mm.datasets.encoding import ProgressSink

log = logging.getLogger(__name__)

KINDS = ("photo", "page", "text", "video")  # the strata of the sample, in report order
_KIND_OF_FILE = {"image": "photo", "pdf": "page", "text": "text", "video": "video"}  # faste_mm.kinds names
DTYPES = ("auto", "float32", "bfloat16", "float16", "int8")  # int8: model/cpu/int8.py (CPU only)
REFERENCE_DTYPE = "float32"
# Where a dtype's fidelity is read against another full forward than the reference: int8 is the
# step past bfloat16 on a CPU, so what it loses is measured against what it replaces, the bf16
# full forward at the official pixel cap (issue 37); that setting then runs as a row of its own.
FIDELITY_BASE = {torch.int8: torch.bfloat16}


@dataclass(frozen=True, slots=True)
class PlanConfig:
    """The candidates and the rule.

    max_pixels: image/page pixel caps to try (each >= 4096; N visual tokens = N x 1024 px).
    r_max: FastE removal ratios for documents (0: the full forward). dtypes: weight dtypes
        ("auto" resolves on the device: see `resolve_dtype`). fast_e: the FastE settings every
        candidate shares, its r_max replaced by each of `r_max`: theta, l_w (None: the backbone's
        defaults) and trigger_layer (a fixed layer instead of the alignment trigger);
        threshold_source says where theta came from.
    target: neighbour agreement@k the recommendation must reach, in (0, 1]. p5_floor: the 5th
        percentile cosine it must also reach (None: 1 - 3 (1 - target)). k: neighbours per item.
    patch_dedup: duplicate-patch removal modes to try ("off", "exact", "near";
        faste_mm.model.patch_dedup), at the official pixel cap (both cut visual tokens: a lower
        cap is the other way) for every r_max and dtype, where the sample has pages or
        screenshot-like images it applies to.
    """

    max_pixels: tuple[int, ...] = PIXEL_SWEEP
    r_max: tuple[float, ...] = (0.0, 0.3, 0.5, 0.7)
    dtypes: tuple[str, ...] = ("auto", "float32")
    target: float = 0.95
    p5_floor: float | None = None
    k: int = 10
    fast_e: FastEConfig = FastEConfig(r_max=0.0)
    threshold_source: str | None = None
    patch_dedup: tuple[str, ...] = ("off",)

    def __post_init__(self) -> None:
        for name in ("max_pixels", "r_max", "dtypes", "patch_dedup"):
            value = getattr(self, name)
            if isinstance(value, (str, int, float)) or not value:
                raise ConfigError(f"PlanConfig.{name} must be a non-empty tuple of candidates, got {value!r}")
            object.__setattr__(self, name, tuple(value))
        for pixels in self.max_pixels:
            pixel_budget(pixels, names=("PlanConfig.max_pixels", "visual_tokens"))
            if pixels < 4096:
                raise ConfigError(f"PlanConfig.max_pixels {pixels} is below the 4096-pixel minimum of an image "
                                  f"(min_pixels); give budgets of at least 4096 pixels (4 visual tokens)")
        if not isinstance(self.fast_e, FastEConfig):
            raise ConfigError(f"PlanConfig.fast_e must be a FastEConfig, got {type(self.fast_e).__name__}")
        for r_max in self.r_max:
            replace(self.fast_e, r_max=r_max)  # FastEConfig's own messages
        for mode in self.patch_dedup:
            PatchDedupConfig(mode)  # its own message names the valid modes
        unknown = [d for d in self.dtypes if d not in DTYPES]
        if unknown:
            raise ConfigError(f"PlanConfig.dtypes: unknown {unknown[0]!r}; valid: {', '.join(DTYPES)}")
        if not 0.0 < self.target <= 1.0:
            raise ConfigError(f"PlanConfig.target is a share of neighbours kept, in (0, 1]; got {self.target}")
        if self.p5_floor is not None and not -1.0 <= self.p5_floor <= 1.0:
            raise ConfigError(f"PlanConfig.p5_floor is a cosine in [-1, 1], got {self.p5_floor}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ConfigError(f"PlanConfig.k must be an int >= 1, got {self.k!r}")

    @property
    def floor(self) -> float:
        """The p5 cosine floor: given, else 1 - 3 (1 - target) (0.85 at target 0.95)."""
        return 1.0 - 3.0 * (1.0 - self.target) if self.p5_floor is None else self.p5_floor

    def rule(self, k: int) -> str:
        source = "given" if self.p5_floor is not None else f"1 - 3 x (1 - {self.target:g})"
        return (f"the cheapest candidate (measured seconds per item) whose neighbour agreement@{k} >= "
                f"{self.target:g} and whose 5th-percentile cosine to the reference >= {self.floor:.4g} ({source})")


@dataclass(frozen=True, slots=True)
class PlanSample:
    """The sampled items, the kind of each, how many files of each kind were found, and why
    sampled files that could not be read were left out."""

    items: tuple[Item, ...]
    kinds: tuple[str, ...]
    found: dict[str, int]
    skipped: tuple[str, ...] = ()
    # Items per kind in all the files found (a PDF's pages: the sampled PDFs' mean page count
    # times the PDFs found), what `plan(folder=...)` estimates the index time of.
    folder: Mapping[str, int] = field(default_factory=dict)


def sample_files(paths: Iterable[str | Path], n: int = 200, seed: int = 0,
                 scan_filter: ScanFilter | None = None) -> PlanSample:
    """A reproducible sample of at most `n` items from files and folders, stratified by kind:
    each kind found gets a share of `n` proportional to its files (at least one). A sampled PDF
    contributes one seeded page. Raises InputError for a path that does not exist and when no
    image, PDF, text or video file is found."""
    paths = [Path(p).expanduser() for p in paths]
    missing = [p for p in paths if not p.exists()]
    if missing:
        raise InputError(f"{missing[0]}: file or folder not found ({len(missing)} of {len(paths)} paths missing); "
                         f"check the path")
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ConfigError(f"sample size must be an int >= 2, got {n!r}")
    by_kind: dict[str, list[Path]] = {kind: [] for kind in KINDS}
    for found in scan_paths(paths, scan_filter).files():
        if found.kind in _KIND_OF_FILE:
            by_kind[_KIND_OF_FILE[found.kind]].append(found.path)
    counts = {kind: len(files) for kind, files in by_kind.items()}
    if not sum(counts.values()):
        names = ", ".join(str(p) for p in paths)
        raise InputError(f"{names}: no images, PDFs, .txt/.md texts or videos found; the sample is empty")
    rng = random.Random(seed)
    items, kinds, skipped, pages = [], [], [], []
    file_kinds = {stratum: name for name, stratum in _KIND_OF_FILE.items()}
    for kind, quota in stratified_quotas(counts, n).items():
        for path in sorted(rng.sample(by_kind[kind], quota)):
            try:
                if kind == "page":
                    pages.append(count_pdf_pages(path))
                items.append(_sample_item(file_kinds[kind], path, rng))
                kinds.append(kind)
            except InputError as error:
                skipped.append(str(error))
    folder = {**counts, "page": round(counts["page"] * (sum(pages) / len(pages) if pages else 1))}
    return PlanSample(tuple(items), tuple(kinds), counts, tuple(skipped), folder)


def stratified_quotas(counts: dict[str, int], n: int) -> dict[str, int]:
    """Items per kind: all of them when there are at most `n` files; else one per kind found
    and the rest proportional to the files left (largest remainder), never more than found."""
    if sum(counts.values()) <= n:
        return dict(counts)
    present = sorted((kind for kind, c in counts.items() if c), key=lambda kind: -counts[kind])
    quotas = {kind: 0 for kind in counts}
    for kind in present[:n]:
        quotas[kind] = 1
    left = n - sum(quotas.values())
    spare = {kind: counts[kind] - quotas[kind] for kind in present}
    total = sum(spare.values())
    shares = {kind: left * spare[kind] / total for kind in present}
    for kind in present:
        quotas[kind] += int(shares[kind])
    for kind in sorted(present, key=lambda kind: -(shares[kind] - int(shares[kind])))[: n - sum(quotas.values())]:
        quotas[kind] += 1
    return quotas


def _sample_item(file_kind: str, path: Path, rng: random.Random) -> Item:
    """The item `index` would embed for this file (faste_mm.kinds); of a PDF, one seeded page."""
    if file_kind == "pdf":
        return Item(image=path, page=rng.randint(1, count_pdf_pages(path)))
    return as_item(document_input(path, file_kind), 0)


def item_kind(item: Item) -> str:
    """photo | page | text | video, the strata of a plan's sample."""
    if item.has_video:
        return "video"
    if item.is_pdf:
        return "page"
    return "photo" if item.has_image else "text"


@dataclass(frozen=True, slots=True)
class _Setting:
    max_pixels: int
    r_max: float
    dtype: torch.dtype
    patch_dedup: str = "off"

    @property
    def name(self) -> str:
        r = "full" if self.r_max == 0 else f"r_max {self.r_max:g}"
        dedup = "" if self.patch_dedup == "off" else f", dedup {self.patch_dedup}"
        return f"{self.max_pixels:,} px, {r}, {_dtype_name(self.dtype)}{dedup}"

    @property
    def dedup(self) -> PatchDedupConfig | None:
        return dedup_config(self.patch_dedup)


def plan(embedder: Embedder, items: Sequence[object], config: PlanConfig | None = None, *,
         queries: Sequence[str] = (), progress: ProgressSink | None = None,
         folder: Mapping[str, int] | None = None) -> PlanReport:
    """Measure every candidate of `config` against the reference setting on `items` (documents:
    str, Path, PIL image or `Item`; a PDF path without a page is all its pages) and recommend the
    cheapest that keeps results (`PlanConfig.rule`). `queries`: typical search texts, embedded
    with the full forward as search does, for query top-k agreement.

    One model load serves every candidate: a dtype other than the embedder's runs on a cast copy
    of the weights (its seconds are in `PlanReport.dtype_prepare_s`). Items that fail in any run
    are left out of every comparison (their reasons in `PlanReport.skipped`).

    progress: told the embeddings to run (one phase) and advanced after each batch.
    folder: items per kind (photo, page, text, video) of all the files the sample was drawn from
        (`PlanSample.folder`): each row then estimates their index time (`CandidateResult.folder_s`)
        at its seconds per item of each kind.
    Raises InputError for an empty sample or fewer than 2 readable items, ConfigError for bad settings.

    Example:
        >>> report = plan(Embedder.from_pretrained(model, dtype="float32"), sample_files(["photos/"]).items,
        ...               PlanConfig(r_max=(0, 0.5), max_pixels=(1_843_200, 501_760)))
        >>> report.recommendation.name
    """
    config = config or PlanConfig()
    inputs = list(items)
    if len(inputs) < 2:
        raise InputError(f"plan: items holds {len(inputs)} item(s); the neighbour comparison needs at least 2 "
                         f"(a sample of the files you will index)")
    expanded, _, _ = expand_items(inputs)
    kinds = [item_kind(item) for item in expanded]
    device = embedder.backbone.device
    reference = _Setting(OFFICIAL_MAX_PIXELS, 0.0, _DTYPE[REFERENCE_DTYPE])
    dtypes, left_out = _accepted_dtypes(config.dtypes, device)
    multimodal = embedder.family.is_multimodal
    settings = _candidates(config, dtypes, reference, multimodal and set(kinds) & {"photo", "page"},
                           multimodal and any(applies_to(item) for item in expanded))
    total = len(expanded) * len(settings) + len(queries) * len({s.dtype for s in settings})
    if progress is not None:
        progress.start(f"plan: {len(settings)} settings x {len(expanded)} items", total)
    models, prepare_s = _models(embedder, {s.dtype for s in settings})
    for model in models.values():  # kernels, allocator and caches warm before any run is timed
        model.encode_documents(inputs[:2], on_error="skip")
    runs: dict[_Setting, EmbedResult] = {}
    query_vectors: dict[torch.dtype, np.ndarray] = {}
    for setting in settings:
        variant = _with_pixels(models[setting.dtype], setting.max_pixels)
        fast_e = None if setting.r_max == 0 else replace(config.fast_e, r_max=setting.r_max)
        advance = None if progress is None else progress.advance
        runs[setting] = variant.encode_documents(inputs, fast_e=fast_e, on_error="skip", progress=advance,
                                                 patch_dedup=setting.dedup)
        if queries and setting.dtype not in query_vectors:
            query_vectors[setting.dtype] = variant.encode_queries(list(queries), progress=advance).embeddings
    ok = np.logical_and.reduce([run.ok for run in runs.values()])
    n_ok = int(ok.sum())
    skipped = sorted({failure.reason for run in runs.values() for failure in run.failures})
    if n_ok < 2:
        raise InputError(f"plan: only {n_ok} of {len(expanded)} items could be embedded in every setting "
                         f"({'; '.join(skipped[:3])}); give at least 2 readable items")
    k = min(config.k, n_ok - 1)
    bases = {setting: _fidelity_base(setting, reference) for setting in settings}
    rows = [_row(setting, runs[setting], runs[base], ok, k, config, embedder, query_vectors.get(setting.dtype),
                 query_vectors.get(base.dtype), setting == reference, None if base == reference else base.name)
            for setting, base in bases.items()]
    if folder:
        rows = [replace(row, folder_s=folder_seconds(inputs, runs[setting], setting.max_pixels, folder))
                for row, setting in zip(rows, bases)]
    rows = _relative(rows, next(row for row in rows if row.is_reference))
    rows.sort(key=lambda row: (row.seconds_per_item, not row.is_reference))
    front = pareto_front([row.seconds_per_item for row in rows], [row.agreement for row in rows])
    rows = [replace(row, pareto=on_front) for row, on_front in zip(rows, front)]
    counts = {kind: sum(1 for i in np.flatnonzero(ok) if kinds[i] == kind) for kind in KINDS}
    return PlanReport(
        model_id=embedder.model_id, model_revision=embedder.loaded.revision, device=device_name(device),
        created=datetime.date.today().isoformat(), sample_size=n_ok, sample_kinds=counts, k=k,
        target=config.target, p5_floor=config.floor, rule=config.rule(k), candidates=tuple(rows),
        recommended=recommend(rows), n_queries=len(queries),
        dtype_prepare_s={_dtype_name(d): s for d, s in prepare_s.items()}, skipped=tuple(skipped), left_out=left_out,
        folder_items=dict(folder or {}))


def folder_seconds(inputs: Sequence[object], run: EmbedResult, max_pixels: int, folder: Mapping[str, int]) -> float:
    """Seconds indexing `folder` (items per kind) takes at `run`'s seconds per item of each kind
    (`retrieval.estimate.seconds_per_item`)."""
    rows = plan_rows(inputs, TokenBounds(SerializerConfig().min_pixels, max_pixels))
    per_item = seconds_per_item(rows, run.stats.batches, run.stats.elapsed_s)
    file_kinds = {stratum: name for name, stratum in _KIND_OF_FILE.items()}
    return float(sum(n * per_item[KIND_NAMES.index(file_kinds[kind])] for kind, n in folder.items()))


_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _fidelity_base(setting: _Setting, reference: _Setting) -> _Setting:
    """The full forward whose vectors `setting`'s are compared with (`FIDELITY_BASE`)."""
    base = FIDELITY_BASE.get(setting.dtype)
    return reference if base is None else _Setting(OFFICIAL_MAX_PIXELS, 0.0, base)


def _accepted_dtypes(names: tuple[str, ...], device: torch.device) -> tuple[list[torch.dtype], dict[str, str]]:
    """The dtypes `names` mean here, and {name: why} for int8 where its trial refused it (in a
    fraction of a second: a candidate slower than bfloat16 is never run for minutes)."""
    dtypes, left_out = [], {}
    for name in names:
        try:
            dtypes.append(resolve_dtype(name, device))
        except ConfigError as refused:
            if name != "int8":
                raise
            left_out[name] = str(refused)
            log.warning("plan: int8 left out: %s", refused)
    if not dtypes:
        raise ConfigError(f"plan: no dtype left to compare ({'; '.join(left_out.values())}); list another, e.g. auto")
    return dtypes, left_out


def _candidates(config: PlanConfig, dtypes: list[torch.dtype], reference: _Setting, has_pixels: bool,
                has_dedup: bool = False) -> list[_Setting]:
    """The reference first, then every (dtype, max_pixels, r_max) once ("auto" resolved, so
    "auto" and the dtype it means run once), each duplicate-patch removal mode at the official
    cap where the sample has images it applies to (`has_dedup`), then any fidelity base not among
    them. Without photos or pages in the sample the pixel cap changes nothing, so only the
    official one is run."""
    pixels = config.max_pixels if has_pixels else (OFFICIAL_MAX_PIXELS,)
    if not has_pixels and set(config.max_pixels) != {OFFICIAL_MAX_PIXELS}:
        log.info("no photos or pages in the sample: max_pixels candidates %s would all equal the official cap",
                 ", ".join(f"{p:,}" for p in config.max_pixels))
    dtypes = dict.fromkeys(dtypes)
    settings = [reference]
    for dtype in dtypes:
        for max_pixels in pixels:
            for r_max in config.r_max:
                modes = config.patch_dedup if has_dedup and max_pixels == OFFICIAL_MAX_PIXELS else ("off",)
                for mode in modes:
                    setting = _Setting(max_pixels, float(r_max), dtype, mode)
                    if setting not in settings:
                        settings.append(setting)
    for setting in list(settings):
        if (base := _fidelity_base(setting, reference)) not in settings:
            settings.append(base)
    return settings


def _models(embedder: Embedder, dtypes: set[torch.dtype]) -> tuple[dict[torch.dtype, Embedder], dict[torch.dtype, float]]:
    """One embedder per dtype over the same loaded model: the embedder itself for its own
    dtype, a cast copy of its weights for another (timed: what a reload would save)."""
    models, prepare_s = {}, {}
    if embedder.dtype_choice.dtype == torch.int8 and dtypes - {torch.int8}:
        raise ConfigError("plan: the model was loaded with dtype int8, whose rounded weights cannot be cast to the "
                          "other candidates; load it with dtype auto and list int8 among the plan's dtypes")
    for dtype in sorted(dtypes, key=str):
        if dtype == embedder.dtype_choice.dtype:
            models[dtype] = embedder
            continue
        started = time.perf_counter()
        reason = "a plan candidate (a converted copy of the weights)"
        # int8: its linear layers quantized over the rest dtype `--dtype int8` loads (model/cpu/int8.py)
        choice = (replace(choose_dtype("int8", embedder.backbone.device), reason=reason) if dtype == torch.int8
                  else DtypeChoice(dtype, reason))
        # the weights only, as the loader casts them: RoPE's inv_freq buffers stay float32
        model = copy.deepcopy(embedder.backbone.model)
        for parameter in model.parameters():
            parameter.data = parameter.data.to(choice.weights_dtype)
        if dtype == torch.int8:
            from faste_mm.model.cpu.int8 import quantize_model

            quantize_model(model, choice.int8_codes)
        loaded = replace(embedder.loaded, backbone=embedder.family.adapter(model), dtype_choice=choice)
        models[dtype] = Embedder(loaded, embedder.batching)
        prepare_s[dtype] = time.perf_counter() - started
    return models, prepare_s


def _with_pixels(embedder: Embedder, max_pixels: int) -> Embedder:
    if not embedder.family.is_multimodal or embedder.serializer.config.max_pixels == max_pixels:
        return embedder
    return embedder.with_serializer(replace(embedder.serializer.config, max_pixels=max_pixels))


def _row(setting: _Setting, run: EmbedResult, ref: EmbedResult, ok: np.ndarray, k: int, config: PlanConfig,
         embedder: Embedder, queries: np.ndarray | None, ref_queries: np.ndarray | None,
         is_reference: bool, fidelity_base: str | None) -> CandidateResult:
    """`setting`'s fidelity to `ref` (the reference's run, or its `fidelity_base`'s) and its cost."""
    vectors, ref_vectors = run.embeddings[ok], ref.embeddings[ok]
    cosines = np.sum(vectors * ref_vectors, axis=1)
    stats = run.stats
    n = max(stats.n_items - stats.n_failed, 1)
    agreement = neighbour_agreement(ref_vectors, vectors, k)
    query_agreement = None
    if queries is not None and len(queries):
        query_agreement = query_top_k_agreement(ref_queries, ref_vectors, queries, vectors, min(config.k, len(vectors)))
    fast_e = embedder.resolve_fast_e(replace(config.fast_e, r_max=setting.r_max)) if setting.r_max else None
    mean_cos, p5_cos = float(cosines.mean()), float(np.percentile(cosines, 5))
    return CandidateResult(
        name=setting.name + (" (reference)" if is_reference else ""), max_pixels=setting.max_pixels,
        r_max=setting.r_max, dtype=_dtype_name(setting.dtype),
        threshold=None if fast_e is None else fast_e.threshold,
        threshold_source=None if fast_e is None else (config.threshold_source or _default_source(config, embedder)),
        warmup_layer=None if fast_e is None else fast_e.warmup_layer,
        trigger_layer=None if fast_e is None else fast_e.trigger_layer, is_reference=is_reference,
        n_items=int(ok.sum()), mean_cos=mean_cos, p5_cos=p5_cos, agreement=agreement,
        query_agreement=query_agreement, seconds_per_item=stats.elapsed_s / n, forward_s_per_item=stats.forward_s / n,
        tower_s_per_item=stats.tower_s / n, decoder_s_per_item=stats.decoder_s / n,
        flops_per_item=(stats.flops_realised + stats.flops_vision) / n, vision_flops_per_item=stats.flops_vision / n,
        meets_target=agreement >= config.target and p5_cos >= config.floor, fidelity_base=fidelity_base,
        patch_dedup=setting.patch_dedup, patches_kept=stats.patches_kept if setting.dedup else None)


def _default_source(config: PlanConfig, embedder: Embedder) -> str:
    return "given" if config.fast_e.threshold is not None else f"backbone default ({embedder.family.name})"


def _relative(rows: list[CandidateResult], reference: CandidateResult) -> list[CandidateResult]:
    return [replace(row, speedup=reference.seconds_per_item / row.seconds_per_item,
                    flops_speedup=reference.flops_per_item / max(row.flops_per_item, 1.0)) for row in rows]


def neighbour_agreement(reference: np.ndarray, candidate: np.ndarray, k: int) -> float:
    """Mean over items of |N_k(i) under reference ∩ N_k(i) under candidate| / k, where N_k(i) is
    item i's k nearest other items by inner product ([n, d] unit vectors each, k < n)."""
    if not 1 <= k < len(reference):
        raise ConfigError(f"neighbour agreement needs 1 <= k < n items, got k={k} with {len(reference)} items")
    ours, theirs = _top_k(reference @ reference.T, k, True), _top_k(candidate @ candidate.T, k, True)
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(ours, theirs)]))


def query_top_k_agreement(ref_queries: np.ndarray, ref_docs: np.ndarray, queries: np.ndarray, docs: np.ndarray,
                          k: int) -> float:
    """Mean over queries of the share of their top-k documents (reference vectors) that the
    candidate's query and document vectors also rank in the top k."""
    ours, theirs = _top_k(ref_queries @ ref_docs.T, k, False), _top_k(queries @ docs.T, k, False)
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(ours, theirs)]))


def _top_k(scores: np.ndarray, k: int, exclude_self: bool) -> np.ndarray:
    """Per row, the columns of the k highest scores (ties broken by column: stable)."""
    scores = scores.astype(np.float64, copy=True)
    if exclude_self:
        np.fill_diagonal(scores, -np.inf)
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]

