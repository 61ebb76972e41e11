"""What embedding cost, in one record every result that reports it shares (`CostTally`): prefix
tokens before and after FastE (sum of N_i and of R_i over the items), the model's seconds in
its two stages (vision tower, decoder) and the image patches duplicate-patch removal kept. A
batch's trace, an encode call's stats, a rerank call's stats, an index run's progress and
report, an evaluation's totals are each a `CostTally` plus their own fields; running totals add
tallies (`+`, `CostTally.total`)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Iterable

from faste_mm.model.flops import removed_share, tower_share


# kw_only: the tally's fields come after a record's own in its constructor, so every record keeps
# its positional fields and adds these by name.
@dataclass(frozen=True, slots=True, kw_only=True)
class CostTally:
    """prefix_tokens: sum of N_i (prefix tokens entering the decoder); kept_prefix_tokens: sum of
    R_i (N_i where nothing was removed); tower_s / decoder_s: model seconds in the vision tower
    (0 for text) and in the decoder (token embeddings to the readout); image_units /
    kept_image_units: merge units of the images duplicate-patch removal looked at, and of those
    the ones kept (faste_mm.model.patch_dedup)."""

    prefix_tokens: int = 0
    kept_prefix_tokens: int = 0
    tower_s: float = 0.0
    decoder_s: float = 0.0
    image_units: int = 0
    kept_image_units: int = 0

    @property
    def prefix_removal(self) -> float:
        """Realised share of prefix tokens removed."""
        return removed_share(self.kept_prefix_tokens, self.prefix_tokens)

    @property
    def tower_share(self) -> float:
        """The vision tower's share of the model's seconds (tower + decoder)."""
        return tower_share(self.tower_s, self.decoder_s)

    @property
    def patches_kept(self) -> float | None:
        """The share of patches duplicate-patch removal kept; None where it looked at no image."""
        return self.kept_image_units / self.image_units if self.image_units else None

    def cost(self) -> "CostTally":
        """Just the tally of this record (a subclass's own fields dropped)."""
        return CostTally(**self.cost_fields())

    def cost_fields(self) -> dict[str, Any]:
        """The tally's fields by name, to build another record with them (`Record(..., **t.cost_fields())`)."""
        return {f.name: getattr(self, f.name) for f in fields(CostTally)}

    def __add__(self, other: "CostTally") -> "CostTally":
        return CostTally(**{name: value + getattr(other, name) for name, value in self.cost_fields().items()})

    @staticmethod
    def total(records: Iterable["CostTally"]) -> "CostTally":
        """The sum of the records' tallies (an empty one for none)."""
        out = CostTally()
        for record in records:
            out = out + record
        return out
