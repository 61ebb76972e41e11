"""What `faste-mm plan` hands back: one row per candidate setting (fidelity to the reference
setting, measured cost), the Pareto frontier, the recommendation and the rule that chose it,
plan.json (`PlanReport.to_dict` / `load_plan`) and the cost-vs-agreement plot.

Loads no torch: `index --plan` reads a plan file before any model loads.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from faste_mm.errors import ConfigError, InputError
from faste_mm.indexers.records import open_regular
from faste_mm.retrieval.receipt import PlanReceipt

PLAN_FORMAT = "faste-mm-plan"
PLAN_VERSION = 1


@dataclass(frozen=True, slots=True)
class CandidateResult:
    """One setting measured on the sample.

    max_pixels: image/page pixel cap; r_max / threshold / warmup_layer / trigger_layer: FastE on
        documents (r_max 0: the full forward; threshold is theta as resolved, with where it came from;
        trigger_layer a fixed compression layer, None for the alignment trigger); dtype: the
        weights' dtype as run ("auto" resolved on this device).
    mean_cos / p5_cos: per-item cosine to the reference vector, mean and 5th percentile.
    agreement: neighbour agreement@k, the mean share of each item's k nearest sample neighbours
        (reference vectors) that the candidate's vectors keep. query_agreement: the same for
        the top-k documents of each query (None without queries).
    seconds_per_item: measured wall seconds of the `encode` call per embedded item (reading,
        resizing and tokenizing overlapped with the model); forward_s_per_item: model seconds;
        tower_s_per_item / decoder_s_per_item: the model seconds split by stage (None where the
        embedder does not time its stages). flops_per_item: decoder (realised) + vision tower.
    speedup / flops_speedup: the reference's seconds (FLOPs) per item over this row's.
    fidelity_base: the setting mean_cos, p5_cos and the agreements compare with when it is not
        the reference (int8: the bfloat16 full forward, `plan.FIDELITY_BASE`); None: the reference.
    """

    name: str
    max_pixels: int
    r_max: float
    dtype: str
    threshold: float | None
    threshold_source: str | None
    warmup_layer: int | None
    is_reference: bool
    n_items: int
    mean_cos: float
    p5_cos: float
    agreement: float
    query_agreement: float | None
    seconds_per_item: float
    forward_s_per_item: float
    tower_s_per_item: float | None
    decoder_s_per_item: float | None
    flops_per_item: float
    vision_flops_per_item: float
    speedup: float = 1.0
    flops_speedup: float = 1.0
    meets_target: bool = False
    pareto: bool = False
    trigger_layer: int | None = None  # last, with a default: plans written before it still load
    fidelity_base: str | None = None  # likewise
    # Seconds indexing all the files the sample came from would take at this row's seconds per
    # item of each kind (`plan.folder_seconds`); None when the plan was not given them.
    folder_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class PlanReport:
    """Candidates ordered by measured seconds per item (cheapest first); `recommended` is the
    row index of the recommendation (`rule` says how it was chosen)."""

    model_id: str
    model_revision: str | None
    device: str
    created: str  # ISO date
    sample_size: int  # items embedded in every run (failures left out)
    sample_kinds: Mapping[str, int]  # photo / page / text / video -> items
    k: int  # neighbours compared per item
    target: float
    p5_floor: float
    rule: str
    candidates: tuple[CandidateResult, ...]
    recommended: int
    n_queries: int = 0
    dtype_prepare_s: Mapping[str, float] = field(default_factory=dict)  # seconds to cast the weights per dtype
    skipped: tuple[str, ...] = ()  # why each unreadable sampled item was left out
    left_out: Mapping[str, str] = field(default_factory=dict)  # dtype -> why it was not run (int8's trial)
    folder_items: Mapping[str, int] = field(default_factory=dict)  # photo / page / text / video -> items of all files

    @property
    def recommendation(self) -> CandidateResult:
        return self.candidates[self.recommended]

    @property
    def reference(self) -> CandidateResult:
        return next(row for row in self.candidates if row.is_reference)

    def row(self, index: int | None) -> CandidateResult:
        """Row `index` of the table (None: the recommendation); ConfigError when out of range."""
        if index is None:
            return self.recommendation
        if not 0 <= index < len(self.candidates):
            raise ConfigError(f"plan row {index} does not exist; the plan has rows 0..{len(self.candidates) - 1}")
        return self.candidates[index]

    def receipt(self, index: int | None = None) -> PlanReceipt:
        """What a collection indexed with row `index` (None: the recommendation) records of the
        plan: the setting, where it was measured, and its measured fidelity and speed-up."""
        chosen = self.row(index)
        return PlanReceipt(r_max=chosen.r_max, max_pixels=chosen.max_pixels, dtype=chosen.dtype,
                           threshold=chosen.threshold, sample_size=self.sample_size, k=self.k,
                           agreement=chosen.agreement, query_agreement=chosen.query_agreement,
                           mean_cos=chosen.mean_cos, p5_cos=chosen.p5_cos, speedup=chosen.speedup,
                           flops_speedup=chosen.flops_speedup, device=self.device, created=self.created,
                           model_id=self.model_id, threshold_source=chosen.threshold_source,
                           fidelity_base=chosen.fidelity_base)

    def settings(self, index: int | None = None) -> dict[str, Any]:
        """Row `index` (None: the recommendation) as the collection settings `Retriever` and
        `Retriever.for_collection` take (pixel cap, FastE as measured, the receipt); the row's
        `dtype` goes to the model loader. Example:
            >>> report, row = load_plan("plan.json")
            >>> r = Retriever.from_pretrained(report.model_id, dtype=report.row(row).dtype, **report.settings(row))
        """
        chosen = self.row(index)
        fast_e = {} if chosen.r_max == 0 else {"threshold": chosen.threshold, "warmup_layer": chosen.warmup_layer}
        if chosen.r_max and chosen.trigger_layer is not None:
            fast_e["trigger_layer"] = chosen.trigger_layer
        return {"max_pixels": chosen.max_pixels, "r_max": chosen.r_max, "receipt": self.receipt(index), **fast_e}

    def check_model(self, model_id: str, source: str = "plan") -> None:
        """ConfigError unless this plan was measured with `model_id` (a hub id, or a local folder
        compared by its absolute path): another model's measurements say nothing about this one."""
        from faste_mm.retrieval.profile import model_name

        if model_name(self.model_id) != model_name(model_id):
            raise ConfigError(f"{source}: the plan was measured with {self.model_id}, but this index embeds with "
                              f"{model_id}; make a plan with this model (faste-mm plan PATHS --model {model_id}) or "
                              f"index with the plan's model")

    def to_dict(self) -> dict[str, Any]:
        return {"format": PLAN_FORMAT, "version": PLAN_VERSION, "model_id": self.model_id,
                "model_revision": self.model_revision, "device": self.device, "created": self.created,
                "sample_size": self.sample_size, "sample_kinds": dict(self.sample_kinds), "k": self.k,
                "n_queries": self.n_queries, "target": self.target, "p5_floor": self.p5_floor, "rule": self.rule,
                "recommended": self.recommended, "dtype_prepare_s": dict(self.dtype_prepare_s),
                "skipped": list(self.skipped), "left_out": dict(self.left_out),
                "folder_items": dict(self.folder_items), "candidates": [row.to_dict() for row in self.candidates]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "plan") -> "PlanReport":
        """Inverse of `to_dict`; ConfigError naming `source` when it is not a plan of this version."""
        if not isinstance(data, Mapping) or data.get("format") != PLAN_FORMAT:
            raise ConfigError(f"{source}: not a faste-mm plan (no \"format\": \"{PLAN_FORMAT}\"); "
                              f"make one with faste-mm plan PATHS --out plan.json")
        if data.get("version") != PLAN_VERSION:
            raise ConfigError(f"{source}: plan version {data.get('version')!r}, this faste-mm reads version "
                              f"{PLAN_VERSION}; make the plan again with this faste-mm")
        try:
            names = {f.name for f in dataclasses.fields(cls)}
            values = {key: value for key, value in data.items() if key in names}
            _check_values(cls, values, source)
            for row in data["candidates"]:
                _check_values(CandidateResult, row, source)
            values["candidates"] = tuple(CandidateResult(**row) for row in data["candidates"])
            values["skipped"] = tuple(values.get("skipped", ()))
            report = cls(**values)
            report.row(report.recommended)
            return report
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
            raise ConfigError(f"{source}: damaged plan ({type(error).__name__}: {error}); make it again with "
                              f"faste-mm plan") from None


# A plan is a few kilobytes (one row per candidate); more is not a plan, and is never read whole.
PLAN_MAX_BYTES = 1 << 20


def load_plan(reference: str | Path) -> tuple[PlanReport, int | None]:
    """Read `PATH` or `PATH:ROW` (a row of the table; none: the recommendation). Raises
    ConfigError naming the file when it is missing, unreadable, not a regular file (a FIFO or
    /dev/zero never blocks or streams in), over PLAN_MAX_BYTES, not a plan, holds a value of the
    wrong type or a non-finite number (NaN), or has no such row."""
    text = str(reference)
    path, row = Path(text), None
    head, sep, tail = text.rpartition(":")
    if sep and tail.isdigit() and not path.exists():
        path, row = Path(head), int(tail)
    try:
        with open_regular(path) as f:
            raw = f.read(PLAN_MAX_BYTES + 1)
        if len(raw) > PLAN_MAX_BYTES:
            raise ConfigError(f"{path}: {len(raw)}+ bytes, not a plan (a plan is a few kilobytes; the limit is "
                              f"{PLAN_MAX_BYTES}); give the plan.json that faste-mm plan wrote")
        data = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except FileNotFoundError:
        raise ConfigError(f"{path}: plan file not found; make one with faste-mm plan PATHS --out {path}") from None
    except InputError as error:  # a FIFO, a device, a folder
        raise ConfigError(f"plan {error}; give the plan.json that faste-mm plan wrote") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:  # JSONDecodeError is a ValueError
        reason = "nested too deeply" if isinstance(error, RecursionError) else error
        raise ConfigError(f"{path}: cannot read the plan ({reason}); make it again with faste-mm plan") from None
    report = PlanReport.from_dict(data, str(path))
    report.row(row)
    return report, row


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number a plan holds")


def _check_values(cls, values: Mapping[str, Any], source: str) -> None:
    """ConfigError naming the field when a value does not have its field's type (`int`, `float`,
    `str`, `bool`, or None where the field allows it) or a float is not finite."""
    allowed = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}
    for f in dataclasses.fields(cls):
        if f.name not in values or not isinstance(f.type, str):
            continue
        kinds = [k.strip() for k in f.type.split("|")]
        if not set(kinds) <= {*allowed, "None"}:
            continue  # mappings and tuples are checked where they are used
        value = values[f.name]
        ok = (value is None and "None" in kinds) or any(
            isinstance(value, t) and (t is bool or not isinstance(value, bool)) for k in kinds if k != "None"
            for t in allowed[k])
        if ok and isinstance(value, float) and not math.isfinite(value):
            ok = False
        if not ok:
            raise ConfigError(f"{source}: damaged plan ({cls.__name__}.{f.name} is {value!r:.60}, expected {f.type}); "
                              f"make it again with faste-mm plan")


def pareto_front(costs: Sequence[float], agreements: Sequence[float]) -> list[bool]:
    """For each point, whether no other point is at least as cheap and as faithful and strictly
    better in one of the two (the settings worth choosing between)."""
    points = list(zip(costs, agreements))
    return [not any(c <= cost and a >= agreement and (c < cost or a > agreement) for c, a in points)
            for cost, agreement in points]


def recommend(rows: Sequence[CandidateResult]) -> int:
    """The cheapest row (by measured seconds per item) that meets the target; the reference
    meets it by construction (agreement and cosines 1), so there always is one."""
    meeting = [i for i, row in enumerate(rows) if row.meets_target]
    return min(meeting, key=lambda i: (rows[i].seconds_per_item, i))


def plot_plan(report: PlanReport, path: Path) -> Path:
    """Measured seconds per item against neighbour agreement, one point per candidate; the
    Pareto frontier joined, the target drawn, the recommendation starred."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report.candidates
    figure, axes = plt.subplots(figsize=(8, 5))
    axes.scatter([r.seconds_per_item for r in rows], [r.agreement for r in rows], color="tab:blue", zorder=2)
    front = sorted((r for r in rows if r.pareto), key=lambda r: r.seconds_per_item)
    axes.plot([r.seconds_per_item for r in front], [r.agreement for r in front], color="tab:orange",
              label="Pareto frontier", zorder=1)
    chosen = report.recommendation
    axes.scatter([chosen.seconds_per_item], [chosen.agreement], marker="*", s=300, color="tab:red",
                 label=f"recommended: {chosen.name}", zorder=3)
    for r in rows:
        axes.annotate(r.name, (r.seconds_per_item, r.agreement), fontsize=7, xytext=(4, 4),
                      textcoords="offset points")
    axes.axhline(report.target, color="gray", linestyle="--", label=f"target {report.target:g}")
    axes.set(xlabel="measured seconds per item (this device)", ylabel=f"neighbour agreement@{report.k}",
             title=f"{Path(report.model_id).name}: cost vs fidelity on {report.sample_size} of your items")
    axes.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
