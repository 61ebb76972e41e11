"""Vector precision: float32, float16, 8-bit scalar codes and sign bits (array in, array out).

A collection has two precisions (see `Manifest.vectors` and `Manifest.keep`):
- the INDEX precision (`vectors`): what the FAISS index in RAM holds and searches first;
- the STORED precision (`stored_precision`): what the vector parts on disk hold, memory-mapped and
  read only for the candidates being rescored (float16/float32 when the float copy is kept, 8-bit
  codes with `keep="int8"`, the index's own codes with `keep="none"`).

8-bit codes ("int8"): per-dimension ranges [lo, hi] calibrated once from the first vectors added
(`calibrate_int8`) and fixed thereafter (stored in the manifest), so a stored code never changes
meaning. code = clip(floor(255 * (x - lo) / (hi - lo)), 0, 255), decoded as lo + (code + 0.5) / 255
* (hi - lo): exactly FAISS's ScalarQuantizer QT_8bit, whose trained table these ranges become.
Binary: one sign bit per dimension, packed 8 to a byte (np.packbits order, FAISS IndexBinary's
layout), compared by Hamming distance; a Hamming distance h over d bits reads as the score
1 - 2h/d (the cosine of the two sign vectors).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from faste_mm.errors import ConfigError
from faste_mm.indexers.vector_choices import KEEPS, PRECISIONS

# Higher ranks reconstruct vectors more exactly; rescoring reads a copy ranked above the index's.
_RANK = {"binary": 0, "pq": 0, "int8": 1, "float16": 2, "float32": 3}  # pq: PQ or RaBitQ codes
# Bytes a precision stores per dimension (binary: 1/8).
BYTES_PER_DIM = {"float32": 4.0, "float16": 2.0, "int8": 1.0, "binary": 0.125}
# A calibrated range is at least this many "typical component sizes" (1/sqrt(dim) for a unit
# vector) either side of the mean, so a first batch of one or a few vectors still leaves room for
# the values later vectors take; values past a range are clipped to it.
_MIN_HALF_RANGE = 4.0
# Each side of the observed [min, max] is widened by this share of the span.
_RANGE_MARGIN = 0.1


def check_precision(vectors: str, keep: str) -> None:
    """ConfigError unless `vectors` and `keep` are known and `keep` is not finer than needed."""
    check_choices(vectors, keep)
    if keep == "int8" and vectors not in ("int8", "binary"):
        raise ConfigError(f"keep='int8' stores 8-bit codes for rescoring a coarser index, but vectors={vectors!r} "
                          f"is not coarser; use keep='float', or vectors='binary'")


def check_choices(vectors: str | None, keep: str | None) -> None:
    """ConfigError for a `vectors` or `keep` value that is not one of the choices (None = not given)."""
    if vectors is not None and vectors not in PRECISIONS:
        raise ConfigError(f"vectors must be one of {PRECISIONS}, got {vectors!r}")
    if keep is not None and keep not in KEEPS:
        raise ConfigError(f"keep must be one of {KEEPS}, got {keep!r}")


def stored_precision(vectors: str, keep: str, vector_dtype: str) -> str:
    """The precision of the vector parts on disk (see the module docstring)."""
    if keep == "float":
        return vector_dtype
    if keep == "int8":
        return "int8"
    return vectors if vectors in ("int8", "binary") else vector_dtype


def rescores(index_precision: str, stored: str) -> bool:
    """Whether the stored copy scores candidates more exactly than the index did."""
    return _RANK[stored] > _RANK[index_precision]


def uses_int8(vectors: str, keep: str) -> bool:
    """Whether the collection needs calibrated 8-bit ranges (index or stored codes)."""
    return vectors == "int8" or keep == "int8"


def stored_width(precision: str, dim: int) -> int:
    """Columns of a stored part: dim, or dim / 8 bytes of packed sign bits."""
    return binary_width(dim) if precision == "binary" else dim


def binary_width(dim: int) -> int:
    if dim % 8:
        raise ConfigError(f"binary vectors need a dim divisible by 8, got dim={dim}; choose a Matryoshka "
                          f"dim such as {dim - dim % 8 or 8}")
    return dim // 8


def numpy_dtype(precision: str) -> str:
    return {"float32": "float32", "float16": "float16", "int8": "uint8", "binary": "uint8"}[precision]


@dataclass(frozen=True, slots=True, eq=False)
class Int8Ranges:
    """Per-dimension ranges of 8-bit codes: lo [d] and hi [d] float32, hi > lo."""

    lo: np.ndarray
    hi: np.ndarray

    def __post_init__(self) -> None:
        lo = np.asarray(self.lo, dtype=np.float32)
        hi = np.asarray(self.hi, dtype=np.float32)
        if lo.ndim != 1 or lo.shape != hi.shape or not np.all(hi > lo) or not np.all(np.isfinite(lo)):
            raise ConfigError(f"int8 ranges need lo and hi of one shape [d] with hi > lo, got {lo.shape} and {hi.shape}")
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Int8Ranges) and np.array_equal(self.lo, other.lo) and np.array_equal(self.hi, other.hi)

    def to_dict(self) -> dict[str, list[float]]:
        return {"lo": self.lo.tolist(), "hi": self.hi.tolist()}

    @classmethod
    def from_dict(cls, d) -> "Int8Ranges":
        return cls(np.asarray(d["lo"], dtype=np.float32), np.asarray(d["hi"], dtype=np.float32))

    @property
    def faiss_table(self) -> np.ndarray:
        """FAISS ScalarQuantizer QT_8bit's trained table: [vmin (d), vdiff (d)]."""
        return np.concatenate([self.lo, self.hi - self.lo]).astype(np.float32)


def calibrate_int8(vectors: np.ndarray) -> Int8Ranges:
    """Ranges from the first vectors [n, d] (see the module constants for the widening)."""
    x = np.asarray(vectors, dtype=np.float32)
    lo, hi, mean = x.min(axis=0), x.max(axis=0), x.mean(axis=0)
    margin = _RANGE_MARGIN * (hi - lo)
    floor = _MIN_HALF_RANGE / np.sqrt(x.shape[1])
    return Int8Ranges(np.minimum(lo - margin, mean - floor), np.maximum(hi + margin, mean + floor))


def encode_int8(x: np.ndarray, ranges: Int8Ranges) -> np.ndarray:
    """float [n, d] -> uint8 codes [n, d] (FAISS's QT_8bit encoding with these ranges)."""
    scaled = (np.asarray(x, dtype=np.float32) - ranges.lo) / (ranges.hi - ranges.lo)
    return np.clip(np.floor(255.0 * scaled), 0, 255).astype(np.uint8)


def decode_int8(codes: np.ndarray, ranges: Int8Ranges) -> np.ndarray:
    """uint8 codes [n, d] -> float32 [n, d] (the value FAISS reconstructs)."""
    return ranges.lo + (np.asarray(codes, dtype=np.float32) + 0.5) / 255.0 * (ranges.hi - ranges.lo)


def encode_binary(x: np.ndarray) -> np.ndarray:
    """float [n, d] -> packed sign bits uint8 [n, d / 8] (bit set where the value is > 0)."""
    return np.packbits(np.asarray(x) > 0, axis=1)


def decode_binary(bits: np.ndarray, dim: int) -> np.ndarray:
    """Packed bits [n, d / 8] -> float32 [n, d] of +-1/sqrt(d) (a unit vector per row)."""
    signs = np.unpackbits(np.asarray(bits, dtype=np.uint8), axis=1, count=dim).astype(np.float32)
    return (2.0 * signs - 1.0) / np.sqrt(dim)


def hamming(queries: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """Hamming distances [q, n] between packed bit rows queries [q, b] and bits [n, b]."""
    xor = np.bitwise_xor(np.asarray(queries, dtype=np.uint8)[:, None, :], np.asarray(bits, dtype=np.uint8)[None, :, :])
    return np.bitwise_count(xor).sum(axis=2, dtype=np.int32)


def hamming_to_score(distances: np.ndarray, dim: int) -> np.ndarray:
    """Hamming distances over `dim` bits -> the sign vectors' cosine 1 - 2h/d (higher = closer)."""
    return (1.0 - 2.0 * np.asarray(distances, dtype=np.float32) / dim).astype(np.float32)


def encode(x: np.ndarray, precision: str, ranges: Int8Ranges | None) -> np.ndarray:
    """Float vectors [n, d] in `precision` (float16/32 cast, int8 codes, packed bits)."""
    if precision == "int8":
        return encode_int8(x, _need(ranges))
    if precision == "binary":
        return encode_binary(x)
    return np.asarray(x, dtype=precision)


def decode(codes: np.ndarray, precision: str, dim: int, ranges: Int8Ranges | None) -> np.ndarray:
    """Inverse of `encode` as float32 [n, d] (exact for floats, the reconstruction otherwise)."""
    if precision == "int8":
        return decode_int8(codes, _need(ranges))
    if precision == "binary":
        return decode_binary(codes, dim)
    return np.asarray(codes, dtype=np.float32)


def _need(ranges: Int8Ranges | None) -> Int8Ranges:
    assert ranges is not None, "8-bit codes need the collection's calibrated ranges"
    return ranges


@dataclass(frozen=True, slots=True)
class Codec:
    """How one collection's parts store vectors: `precision` (see `stored_precision`), the vector
    width `dim` and, for 8-bit codes, the calibrated ranges."""

    precision: str
    dim: int
    ranges: Int8Ranges | None = None

    @property
    def width(self) -> int:
        """Columns of a stored part."""
        return stored_width(self.precision, self.dim)

    @property
    def dtype(self) -> str:
        return numpy_dtype(self.precision)

    def encode(self, x: np.ndarray) -> np.ndarray:
        """Float vectors [n, d] -> stored codes [n, width]."""
        return encode(x, self.precision, self.ranges)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Stored codes [n, width] -> float32 [n, d]."""
        return decode(codes, self.precision, self.dim, self.ranges)

    def bits(self, codes: np.ndarray) -> np.ndarray:
        """Stored codes [n, width] -> packed sign bits [n, d / 8] (a binary index's input)."""
        return np.asarray(codes, dtype=np.uint8) if self.precision == "binary" else encode_binary(self.decode(codes))
