"""A collection's receipt: what `faste-mm plan` measured for the setting the collection was
indexed with (`index --plan`): its fidelity to the reference setting on a sample of the user's
files and its speed-up, kept in the manifest and shown in one line by `info`, `/info` and the
search page. Loads no torch (info and serve read it cheaply).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from faste_mm.errors import ConfigError

NOT_MEASURED = "not measured (indexed without faste-mm plan)"


@dataclass(frozen=True, slots=True)
class PlanReceipt:
    """The plan row a collection was indexed with (see `faste_mm.tools.plan_report.CandidateResult`).

    r_max / max_pixels / dtype / threshold: the setting. sample_size, k: items measured on and
    neighbours compared per item. agreement: neighbour agreement@k; query_agreement: the queries'
    top-k agreement (None without queries); mean_cos / p5_cos: cosine to the reference vectors.
    speedup / flops_speedup: the reference's (full forward, official pixels, float32) measured
    seconds (FLOPs) per item over this setting's. device, created, model_id: where and when.
    fidelity_base: what agreement and cosines compare with when not the reference (int8: the
    bfloat16 full forward); None: the reference. patch_dedup: duplicate-patch removal ("off",
    "exact", "near"); patches_kept: the share of the sample's page and screenshot patches it kept.
    """

    r_max: float
    max_pixels: int
    dtype: str
    threshold: float | None
    sample_size: int
    k: int
    agreement: float
    query_agreement: float | None
    mean_cos: float
    p5_cos: float
    speedup: float
    flops_speedup: float
    device: str
    created: str
    model_id: str
    threshold_source: str | None = None
    fidelity_base: str | None = None
    patch_dedup: str = "off"
    patches_kept: float | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PlanReceipt":
        """From manifest JSON or a plan; ConfigError naming unknown or missing keys."""
        names = [f.name for f in dataclasses.fields(cls)]
        optional = {"threshold_source", "fidelity_base", "patch_dedup", "patches_kept"}  # added after receipts were first written
        if not isinstance(data, Mapping) or not set(names) - optional <= set(data) <= set(names):
            given = sorted(data) if isinstance(data, Mapping) else type(data).__name__
            raise ConfigError(f"a plan receipt needs exactly the keys {names}, got {given}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One line: "r_max 0.5 at 1,003,520 px: on 200 of your files, 96% of neighbours kept,
        2.4x cheaper than full"."""
        setting = "full forward" if self.r_max == 0 else f"r_max {self.r_max:g}"
        dtype = "" if self.dtype == "float32" else f", {self.dtype}"
        base = "" if self.fidelity_base is None else f" (against {self.fidelity_base})"
        if self.patch_dedup != "off":
            kept = "" if self.patches_kept is None else f", {self.patches_kept:.0%} of page patches kept"
            kept += f", cosine {self.mean_cos:.3f} to every patch kept"
            dtype += f", duplicate patches dropped ({self.patch_dedup}{kept})"
        return (f"{setting} at {self.max_pixels:,} px{dtype}: on {self.sample_size} of your files, "
                f"{self.agreement:.0%} of neighbours kept{base}, {self.speedup:.1f}x cheaper than full")


def receipt_summary(receipt: PlanReceipt | None) -> str:
    """The receipt's one line, or that the collection's setting was never measured."""
    return NOT_MEASURED if receipt is None else receipt.summary()
