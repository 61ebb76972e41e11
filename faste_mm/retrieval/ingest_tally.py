"""The running totals of one index run (`IngestTally`, updated chunk by chunk) and the failures it
records (`IndexFailure`); ingest fills them, the executors merge them, `IndexReport` reports them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from faste_mm.model.cost import CostTally

if TYPE_CHECKING:
    from faste_mm.model.embedder import EmbedStats


@dataclass(frozen=True, slots=True)
class IndexFailure:
    """A file (or PDF page) that could not be indexed, and why."""

    uri: str
    page: int | None
    error: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class IngestTally:
    """Running totals of one index call (mutable on purpose: updated chunk by chunk)."""

    embedded: int = 0
    reused: int = 0
    failures: list[IndexFailure] = field(default_factory=list)
    cost: CostTally = field(default_factory=CostTally)  # prefix tokens, tower and decoder seconds
    metadata_issues: Counter = field(default_factory=Counter)  # reason -> files whose field it emptied
    facts_filled: int = 0  # items of unchanged files given their facts (no re-embedding)
    # The files behind the counts, for `watch -v` and the JSON reports: those run through the model,
    # and (file, the file whose vectors it took) for those that reused a same-content file's vectors.
    embedded_files: list[str] = field(default_factory=list)
    reused_files: list[tuple[str, str]] = field(default_factory=list)

    def merge(self, other: "IngestTally") -> None:
        """Add the totals of a committed chunk (every field, so a new total cannot be left out)."""
        for name in (f.name for f in fields(self)):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def add_stats(self, stats: EmbedStats | None) -> None:
        if stats is not None:
            self.cost = self.cost + stats
