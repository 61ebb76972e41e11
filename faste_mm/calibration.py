"""Label-free calibration of FastE's threshold theta on the user's own documents.

One full pass records the batch-mean readout/prefix alignment before every layer; one pass per
candidate trigger layer l (compression forced before l at the requested r_max) records each
item's distortion 1 - cos(z_full, z_l) (the paper's alignment-distortion diagnostic). Batches
are identical in every pass, so any theta can then be evaluated without running the model
again: a batch's trigger is the first layer l >= l_w whose alignment reaches theta (else the
last layer), and its items take the embeddings of that pass. The recommended theta is the
smallest one whose fidelity meets the target, i.e. the most savings at the requested fidelity.
"""

from __future__ import annotations

import datetime
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from faste_mm.compressors import FastEConfig
from faste_mm.errors import ConfigError, InputError
from faste_mm.flops import batch_flops, full_batch_flops

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CalibrationConfig:
    """r_max: the removal ratio to calibrate for. target: mean cosine to the full forward that a
    theta must reach. p5_floor: 5th-percentile cosine it must also reach (None: 1 - 3 (1 - target)).
    warmup_layer: l_w (None: backbone default). thetas: candidates (None: 0.05 steps over the
    observed alignment range)."""

    r_max: float = 0.5
    target: float = 0.99
    p5_floor: float | None = None
    warmup_layer: int | None = None
    thetas: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        FastEConfig(r_max=self.r_max, warmup_layer=self.warmup_layer)  # same checks, same messages
        if not 0.0 < self.target <= 1.0:
            raise ConfigError(f"CalibrationConfig.target is a cosine in (0, 1], got {self.target}")
        if self.p5_floor is not None and not -1.0 <= self.p5_floor <= 1.0:
            raise ConfigError(f"CalibrationConfig.p5_floor is a cosine in [-1, 1], got {self.p5_floor}")

    @property
    def floor(self) -> float:
        return 1.0 - 3.0 * (1.0 - self.target) if self.p5_floor is None else self.p5_floor


@dataclass(frozen=True, slots=True)
class ThetaReport:
    """What one candidate theta would do on the sample."""

    theta: float
    trigger_layers: dict[int, int]  # layer -> number of batches triggering there
    mean_trigger_layer: float
    mean_cos: float
    p5_cos: float
    flops_reduction: float
    meets_target: bool
    recall_retention: dict | None = None  # with labelled data: {"recall@1": .., "recall@10": ..}


@dataclass(frozen=True, slots=True)
class Calibration:
    model_id: str
    revision: str | None
    r_max: float
    warmup_layer: int
    target: float
    p5_floor: float
    sample_size: int
    created: str  # ISO date
    threshold: float | None  # the recommendation; None when no candidate meets the target
    alignment: list[list[float]]  # per batch: batch-mean alignment before each layer
    distortion: dict[int, float]  # trigger layer -> mean 1 - cos(z_full, z_l)
    thetas: list[ThetaReport] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Calibration":
        data = dict(data)
        data["distortion"] = {int(k): v for k, v in data["distortion"].items()}
        reports = []
        for report in data.get("thetas", []):
            report = dict(report)
            report["trigger_layers"] = {int(k): v for k, v in report["trigger_layers"].items()}
            reports.append(ThetaReport(**report))
        data["thetas"] = reports
        return cls(**data)

    def describe(self) -> str:
        """Where a theta came from, for manifests and `info`."""
        return (
            f"calibrated {self.created}: target cos {self.target:g} at r_max {self.r_max:g}, "
            f"{self.sample_size} items"
        )


@dataclass(frozen=True, slots=True)
class _Runs:
    """Per batch: rows, alignment curve; per trigger layer: embeddings and realised FLOPs."""

    rows: list[list[int]]
    curves: np.ndarray  # [n_batches, L]
    full: np.ndarray  # [n_items, d]
    by_layer: dict[int, np.ndarray]  # l -> [n_items, d]
    flops_by_layer: dict[int, list[int]]  # l -> per batch FLOPs
    flops_full: list[int]  # per batch


def trigger_layer_for(curve: np.ndarray, theta: float, warmup: int) -> int:
    """Eq. threshold-trigger for one batch: the first l >= l_w with alignment >= theta, else L-1."""
    last = len(curve) - 1
    for layer in range(min(warmup, last), last):
        if curve[layer] >= theta:
            return layer
    return last


def evaluate_thetas(
    curves: np.ndarray,
    cosines: dict[int, list[np.ndarray]],
    flops: dict[int, list[int]],
    flops_full: list[int],
    thetas: list[float],
    warmup: int,
    config: CalibrationConfig,
) -> list[ThetaReport]:
    """Score each theta from recorded runs. cosines[l][b]: per-item cos(z_full, z_l) of batch b."""
    reports = []
    for theta in thetas:
        layers = [trigger_layer_for(curve, theta, warmup) for curve in curves]
        values = np.concatenate([cosines[layer][b] for b, layer in enumerate(layers)])
        realised = sum(flops[layer][b] for b, layer in enumerate(layers))
        mean_cos, p5_cos = float(values.mean()), float(np.percentile(values, 5))
        reports.append(
            ThetaReport(
                theta=round(float(theta), 6),
                trigger_layers={int(l): layers.count(l) for l in sorted(set(layers))},
                mean_trigger_layer=float(np.mean(layers)),
                mean_cos=mean_cos,
                p5_cos=p5_cos,
                flops_reduction=1.0 - realised / sum(flops_full),
                meets_target=mean_cos >= config.target and p5_cos >= config.floor,
            )
        )
    return reports


def recommend(reports: list[ThetaReport]) -> float | None:
    """The smallest theta from which every larger candidate also meets the target.

    Requiring the whole upper range (not just one point) guards against a lucky dip: on a
    plateau-then-climb alignment curve a theta just above the plateau can pass by chance on
    one sample while its neighbours trigger far too early.
    """
    best = None
    for report in sorted(reports, key=lambda r: r.theta, reverse=True):
        if not report.meets_target:
            break
        best = report.theta
    return best


def calibrate(embedder, items: list, config: CalibrationConfig, labels: tuple | None = None) -> Calibration:
    """Run the passes on `items` (documents) and recommend a theta. See the module docstring.

    labels: optional (query_vectors [q, d], candidate lists indexing `items`, gold first) to also
    report Recall@1/10 retention per theta (MMEB data); the recommendation stays label-free.
    """
    if len(items) < 2:
        raise InputError("calibration needs at least 2 documents; pass more files or a larger --sample")
    resolved = embedder.resolve_fast_e(FastEConfig(r_max=config.r_max, warmup_layer=config.warmup_layer))
    runs = _run_passes(embedder, items, config.r_max, resolved.warmup_layer)
    cosines = {
        layer: [np.sum(runs.full[rows] * vectors[rows], axis=1) for rows in runs.rows]
        for layer, vectors in runs.by_layer.items()
    }
    thetas = list(config.thetas) if config.thetas else _default_thetas(runs.curves, resolved.warmup_layer)
    reports = evaluate_thetas(runs.curves, cosines, runs.flops_by_layer, runs.flops_full, thetas, resolved.warmup_layer, config)
    if labels is not None:
        reports = [_with_recall(report, runs, labels, resolved.warmup_layer) for report in reports]
    distortion = {layer: float(1.0 - np.concatenate(values).mean()) for layer, values in cosines.items()}
    threshold = recommend(reports)
    if threshold is None:
        log.warning("no candidate theta reaches mean cos %.3f at r_max %g; lower --r-max or --target", config.target, config.r_max)
    return Calibration(
        model_id=embedder.model_id,
        revision=embedder.loaded.revision,
        r_max=config.r_max,
        warmup_layer=resolved.warmup_layer,
        target=config.target,
        p5_floor=config.floor,
        sample_size=len(runs.full),
        created=datetime.date.today().isoformat(),
        threshold=threshold,
        alignment=runs.curves.tolist(),
        distortion=distortion,
        thetas=reports,
    )


def _with_recall(report: ThetaReport, runs: _Runs, labels: tuple, warmup: int) -> ThetaReport:
    from dataclasses import replace

    from faste_mm.datasets.metrics import gold_ranks, score_ranks

    query_vectors, lists = labels
    candidates = np.empty_like(runs.full)
    for rows, curve in zip(runs.rows, runs.curves):
        candidates[rows] = runs.by_layer[trigger_layer_for(curve, report.theta, warmup)][rows]
    full = score_ranks(gold_ranks(query_vectors, runs.full, lists))
    got = score_ranks(gold_ranks(query_vectors, candidates, lists))
    retention = {
        "recall@1": got.recall_at_1 / full.recall_at_1 if full.recall_at_1 else None,
        "recall@10": got.recall_at_10 / full.recall_at_10 if full.recall_at_10 else None,
    }
    return replace(report, recall_retention=retention)


def _run_passes(embedder, items: list, r_max: float, warmup: int) -> _Runs:
    shape = embedder.backbone.shape
    full = embedder.encode_documents(items, on_error="skip", record_alignment=True)
    ok = full.ok
    if ok.sum() < 2:
        raise InputError(f"calibration needs at least 2 readable documents, got {int(ok.sum())} ({len(full.failures)} failed)")
    kept = [full.items[i] for i in np.flatnonzero(ok)]
    if not ok.all():  # re-run on the readable items only so every pass sees the same batches
        full = embedder.encode_documents(kept, record_alignment=True)
    traces = full.stats.batches
    curves = np.array([[value for _, value in trace.alignment] for trace in traces])  # [n_batches, L]
    by_layer, flops_by_layer = {}, {}
    last = shape.num_layers - 1
    for layer in range(min(warmup, last), shape.num_layers):
        result = embedder.encode_documents(kept, fast_e=FastEConfig(r_max=r_max, trigger_layer=layer))
        if [t.rows for t in result.stats.batches] != [t.rows for t in traces]:
            raise RuntimeError("batches differ between calibration passes")  # invariant of the batcher
        by_layer[layer] = result.embeddings
        flops_by_layer[layer] = [batch_flops(shape, t.batch_size, t.padded_lengths) for t in result.stats.batches]
    return _Runs(
        rows=[t.rows for t in traces],
        curves=curves,
        full=full.embeddings,
        by_layer=by_layer,
        flops_by_layer=flops_by_layer,
        flops_full=[full_batch_flops(shape, t.batch_size, t.padded_lengths[0]) for t in traces],
    )


def _default_thetas(curves: np.ndarray, warmup: int) -> list[float]:
    """0.05 steps covering the alignments seen from the warm-up layer on, plus one above them."""
    observed = curves[:, min(warmup, curves.shape[1] - 1) :]
    low = np.floor(observed.min() * 20) / 20
    high = np.ceil(observed.max() * 20) / 20 + 0.05
    return [round(t, 4) for t in np.arange(low, high + 1e-9, 0.05)]


# -- saved calibrations: one small JSON file per user, keyed by model id and revision --


def calibrations_file() -> Path:
    import platformdirs

    return Path(platformdirs.user_config_dir("faste-mm")) / "calibrations.json"


def _key(model_id: str, revision: str | None) -> str:
    return f"{model_id}@{revision or 'main'}"


def save_calibration(calibration: Calibration, path: Path | None = None) -> Path:
    """Store (replacing an older one for the same model and revision); returns the file."""
    from faste_mm.indexers._atomic import atomic_write_bytes

    path = path or calibrations_file()
    saved = json.loads(path.read_text()) if path.exists() else {}
    saved[_key(calibration.model_id, calibration.revision)] = calibration.to_dict()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(saved, indent=2).encode())
    return path


def load_calibration(model_id: str, revision: str | None, path: Path | None = None) -> Calibration | None:
    """The saved calibration of this model and revision, or None (saying why in the log)."""
    path = path or calibrations_file()
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        log.warning("%s: unreadable calibration file (%s); using the backbone default theta", path, error)
        return None
    entry = saved.get(_key(model_id, revision))
    if entry is None:
        if saved:
            log.info(
                "saved calibrations are for other models (%s), not %s; using the backbone default theta",
                ", ".join(sorted(saved)),
                _key(model_id, revision),
            )
        return None
    return Calibration.from_dict(entry)


def plot_calibration(calibration: Calibration, path: Path) -> Path:
    """Alignment per layer (batch mean, min-max band) with the chosen theta, and distortion per
    trigger layer, side by side in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = np.array(calibration.alignment)
    layers = np.arange(curves.shape[1])
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(layers, curves.mean(axis=0), marker="o", label="batch-mean alignment (mean)")
    left.set_xticks(layers)
    left.fill_between(layers, curves.min(axis=0), curves.max(axis=0), alpha=0.2, label="min-max over batches")
    left.axvline(calibration.warmup_layer, color="gray", linestyle="--", label=f"warm-up l_w = {calibration.warmup_layer}")
    if calibration.threshold is not None:
        left.axhline(calibration.threshold, color="red", label=f"theta = {calibration.threshold:g}")
    left.set(xlabel="layer", ylabel="cos(readout, mean prefix)", title="Readout/prefix alignment")
    left.legend(fontsize=8)
    trigger = sorted(calibration.distortion)
    right.semilogy(trigger, [max(calibration.distortion[l], 1e-9) for l in trigger], marker="o")
    right.set_xticks(trigger)
    right.axhline(1.0 - calibration.target, color="red", linestyle="--", label=f"1 - target = {1 - calibration.target:.3g}")
    right.set(xlabel="trigger layer", ylabel="mean 1 - cos(z_full, z_FastE)", title=f"Distortion at r_max {calibration.r_max:g}")
    right.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
