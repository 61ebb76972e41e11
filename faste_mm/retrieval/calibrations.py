"""Saved FastE calibrations, as a Retriever reads them: the `Calibration` record that
`faste_mm.tools.calibration.calibrate` produces, one JSON file per user keyed by model id and
revision, the check that a calibration fits a collection, and recording it in the collection's
profile (`apply_calibration`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from faste_mm.errors import CollectionError, ConfigError
from faste_mm.indexers import Collection
from faste_mm.indexers.atomic_files import atomic_write_bytes
from faste_mm.retrieval.maintenance import collection_path
from faste_mm.retrieval.profile import CollectionProfile

log = logging.getLogger(__name__)


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
    sample_size: int  # documents (rows) embedded in every pass; skipped ones excluded
    created: str  # ISO date
    threshold: float | None  # the recommendation; None when no candidate meets the target
    alignment: list[list[float]]  # per batch: batch-mean alignment before each layer
    distortion: dict[int, float]  # trigger layer -> mean 1 - cos(z_full, z_l)
    thetas: list[ThetaReport] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # why each unreadable document was left out

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



def calibrations_file() -> Path:
    import platformdirs

    return Path(platformdirs.user_config_dir("faste-mm")) / "calibrations.json"


def _key(model_id: str, revision: str | None) -> str:
    return f"{model_id}@{revision or 'main'}"


def check_collection_target(root: Path, profile, model_id: str, revision: str | None, *,
                            revision_known: bool = True) -> None:
    """Raise unless a theta calibrated on `model_id` at `revision` can be recorded in the collection
    at `root` (its `CollectionProfile`): the same model, and FastE on (r_max > 0). `faste-mm
    calibrate --save -c` checks this before the model loads (revision_known=False: only the loaded
    model knows its revision), so a long run is never thrown away at the end; recording it checks
    again, fully."""
    if profile.model_id != model_id or (revision_known and profile.model_revision != revision):
        raise CollectionError(
            f"{root}: the collection embeds with {profile.model_id}, the calibration is for "
            f"{model_id}; calibrate with --model {profile.model_id}"
        )
    if profile.r_max == 0:
        raise ConfigError(f"{root}: the collection uses the full forward (r_max 0); there is no theta to set")


def save_calibration(calibration: Calibration, path: Path | None = None) -> Path:
    """Store (replacing an older one for the same model and revision); returns the file."""
    path = path or calibrations_file()
    saved = json.loads(path.read_text()) if path.exists() else {}
    if not isinstance(saved, dict):
        raise ConfigError(f"{path}: holds a JSON {type(saved).__name__}, not an object of calibrations; move it "
                          f"away (the next save starts a new one)")
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
    if not isinstance(saved, dict):
        log.warning("%s: holds a JSON %s, not an object of calibrations ({\"MODEL@REVISION\": {...}}) as "
                    "`faste-mm calibrate --save` writes; using the backbone default theta", path, type(saved).__name__)
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
    try:
        return Calibration.from_dict(entry)
    except (AttributeError, KeyError, TypeError, ValueError) as error:
        log.warning("%s: the calibration of %s is not one `faste-mm calibrate --save` writes (%s: %s); using "
                    "the backbone default theta", path, _key(model_id, revision), type(error).__name__, error)
        return None


def apply_calibration(calibration: Calibration, collection: str | os.PathLike | None) -> Path:
    """Record a calibrated theta in a collection's profile: its new documents use it from now on
    (vectors already stored keep theirs; they stay comparable). Raises CollectionError on a
    model mismatch, ConfigError for a full-forward collection."""
    root = collection_path(collection)
    with Collection.open(root, writable=True) as col:
        profile = CollectionProfile.from_manifest(col.manifest)
        check_collection_target(root, profile, calibration.model_id, calibration.revision)
        calibrated = dataclasses.replace(profile, threshold=calibration.threshold,
                                         warmup_layer=calibration.warmup_layer,
                                         threshold_source=calibration.describe())
        col.update_settings(calibrated.to_manifest(base=col.manifest).settings)
    return root
