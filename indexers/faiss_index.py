"""The derived FAISS index: pick a factory string, build it from vector parts, search it.

Receives float32 vectors + int64 ids (from the collection's parts); hands back an
`IndexIDMap2`-wrapped index whose ids are the collection's item ids, so ids survive rebuilds.
`auto` ports the idea of autofaiss's `get_optimal_index_keys_v2` (exact when small, graph when it
fits in memory, IVF when the graph gets slow to build, 8-bit codes then OPQ+PQ when raw vectors do
not fit), in the collection's index precision (`Manifest.vectors`): "int8" climbs SQ8 rungs, "binary"
FAISS's binary indexes (BFlat, then BIVF), searched by Hamming distance over sign bits.
Parts arrive in their stored precision with a `quantization.Codec` that decodes them.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import re
from pathlib import Path
from typing import Sequence

import faiss
import numpy as np

from faste_mm.errors import CollectionError, ConfigError
from faste_mm.indexers.atomic_files import atomic_write
from faste_mm.indexers.quantization import Codec, Int8Ranges, binary_width

log = logging.getLogger(__name__)

INDEX_NAME = "index.faiss"

# Below this size `auto` searches exactly. Measured on 2 CPU cores at d=2048 (docs/benchmarks-log.md):
# a Flat scan costs ~0.6 ms per 1k vectors per single query, so 50k vectors stay near 30 ms with
# no build cost, whereas HNSW32 needs ~0.5 ms of build time per vector (~25 s at 50k) and is
# approximate. Batched queries use BLAS and are far cheaper per query than that.
FLAT_MAX_VECTORS = 50_000
# HNSW build time grows ~linearly (tens of minutes per million 2048-d vectors on a laptop);
# past this IVF with an HNSW coarse quantizer builds an order of magnitude faster.
HNSW_MAX_VECTORS = 1_000_000
HNSW_M = 32
_HNSW_LINK_BYTES = HNSW_M * 2 * 4 + 64  # level-0 links (2M int32) + upper levels/bookkeeping
_IDMAP_BYTES = 16  # id + reverse map entry per vector in IndexIDMap2
# Sample sizes: faiss's k-means wants >= 39 points per centroid; 64 gives stable centroids.
_TRAIN_POINTS_PER_CENTROID = 64
_PQ_MIN_TRAIN = 39 * 256
DEFAULT_EF_SEARCH = 128
# A binary flat scan reads d/8 bytes per vector (256 at d=2048): 32x less than a float Flat scan, so
# it stays exact to 16x FLAT_MAX_VECTORS before BIVF's approximate probing pays (docs/benchmarks-log.md).
BINARY_FLAT_MAX_VECTORS = 16 * FLAT_MAX_VECTORS


def is_binary_factory(factory: str) -> bool:
    """Binary factory strings (FAISS's index_binary_factory) start with "B" and a binary index
    name: BFlat, BIVF1024, BHNSW32, BHash64 (not any word that starts with a B)."""
    return re.match(r"B(Flat|IVF|HNSW|Hash)", factory) is not None


@functools.lru_cache(maxsize=64)  # asked several times a search, of a handful of strings
def factory_precision(factory: str) -> str:
    """What the index made by `factory` holds per vector: "binary", "pq" (product or RaBitQ codes),
    "int8", "float16" or "float32" (the order in which they reconstruct vectors more exactly)."""
    if is_binary_factory(factory):
        return "binary"
    if "PQ" in factory or "RaBitQ" in factory:
        return "pq"
    if "SQ8" in factory:
        return "int8"
    if "SQfp16" in factory:
        return "float16"
    return "float32"


def _nlist(n: int) -> int:
    """IVF list count ~ 4 * sqrt(n) (faiss wiki guideline), rounded to a power of two so the
    factory string of `auto` only changes when the collection grows ~4x."""
    return int(2 ** round(math.log2(max(4 * math.sqrt(max(n, 1)), 64))))


def auto_factory(n: int, dim: int, memory_budget_bytes: int, vectors: str = "float32") -> str:
    """Choose a factory string for `n` vectors of width `dim` within `memory_budget_bytes`, holding
    `vectors` precision ("float32" may step down to 8-bit codes and PQ when floats do not fit)."""
    nlist = _nlist(n)
    if vectors == "binary":
        return "BFlat" if n < BINARY_FLAT_MAX_VECTORS else f"BIVF{nlist}"
    codes = {"float32": ("Flat", "", 4), "float16": ("SQfp16", "_SQfp16", 2), "int8": ("SQ8", "_SQ8", 1)}
    rungs = [codes[vectors]] + ([codes["int8"]] if vectors == "float32" else [])
    for flat, hnsw_suffix, bytes_per_dim in rungs:
        raw = n * (bytes_per_dim * dim + _IDMAP_BYTES)
        if n < FLAT_MAX_VECTORS and raw <= memory_budget_bytes:
            return flat
        if n < HNSW_MAX_VECTORS and raw + n * _HNSW_LINK_BYTES <= memory_budget_bytes:
            return f"HNSW{HNSW_M}{hnsw_suffix}"
        centroids = nlist * (4 * dim + _HNSW_LINK_BYTES)
        if raw + n * 8 + centroids <= memory_budget_bytes:
            return f"IVF{nlist}_HNSW{HNSW_M},{flat}"
    if vectors != "float32":
        log.warning("%d vectors of dim %d in %s exceed the memory budget of %d bytes; using an IVF index "
                    "of them anyway (raise the budget, or choose vectors='binary')", n, dim, vectors,
                    memory_budget_bytes)
        return f"IVF{nlist}_HNSW{HNSW_M},{codes[vectors][0]}"
    # Product quantization: m bytes per vector; OPQ rotates into d' = 4m dims first so each
    # sub-quantizer sees 4 dims (the ratio autofaiss and the faiss wiki use). "np" skips
    # polysemous training, which only serves Hamming-filtered search (unused here) and
    # dominates training time (18 s vs 0.2 s for PQ16x8 on 2k vectors).
    for m in (256, 128, 64, 32, 16, 8):
        d_out = min(dim, 4 * m)
        if d_out % m or m > dim:
            continue
        pq_bytes = n * (m + _IDMAP_BYTES + 8) + nlist * (4 * d_out + _HNSW_LINK_BYTES)
        if pq_bytes + 4 * dim * d_out <= memory_budget_bytes:
            return f"OPQ{m}_{d_out},IVF{nlist}_HNSW{HNSW_M},PQ{m}x8np"
    log.warning("%d vectors of dim %d exceed the memory budget of %d bytes even with 8-byte "
                "PQ codes; using the smallest index", n, dim, memory_budget_bytes)
    return f"OPQ8_32,IVF{nlist}_HNSW{HNSW_M},PQ8x8np"


def validate_factory(index_type: str, dim: int, vectors: str = "float32") -> None:
    """ConfigError unless `index_type` is "auto" or a FAISS factory string usable here whose codes
    are in the `vectors` precision (a float32 collection may use any, its parts rescore them)."""
    if index_type == "auto":
        if vectors == "binary":
            binary_width(dim)
        return
    if "IDMap" in index_type:
        raise ConfigError(f"index_type {index_type!r}: do not include IDMap, the collection wraps "
                          f"every index in IndexIDMap2 itself; drop the IDMap part")
    if vectors != "float32" and factory_precision(index_type) != vectors:
        examples = {"binary": "'BFlat', 'BIVF1024'", "int8": "'SQ8', 'HNSW32_SQ8', 'IVF1024_HNSW32,SQ8'",
                    "float16": "'SQfp16', 'HNSW32_SQfp16'"}[vectors]
        raise ConfigError(f"index_type {index_type!r} does not hold {vectors} vectors; use 'auto' or e.g. {examples}")
    try:
        if is_binary_factory(index_type):
            faiss.index_binary_factory(dim, index_type)
        else:
            faiss.index_factory(dim, index_type, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        reason = _faiss_reason(e)
        raise ConfigError(
            f"index_type {index_type!r} is not a valid FAISS factory string for dim={dim} "
            f"({reason}); use 'auto' or e.g. 'Flat', 'HNSW32', 'IVF1024_HNSW32,Flat', "
            f"'OPQ64_256,IVF4096_HNSW32,PQ64x8np'") from None


def _faiss_reason(error: RuntimeError) -> str:
    """FAISS's message without its C++ function and source location."""
    text = str(error).strip().splitlines()[-1]
    return re.sub(r"^Error in .*? at \S+:\d+: (Error: '.*?' failed: )?", "", text)


def check_factory_syntax(index_type: str) -> None:
    """ConfigError when `index_type` is not "auto" and FAISS cannot parse it at all: checkable
    before the model (and so the vector width) is known. Whether a parsable string suits the
    width is `validate_factory`'s check."""
    if index_type == "auto" or "IDMap" in index_type:
        validate_factory(index_type, 1)  # auto passes; IDMap gets its own message
        return
    try:
        if is_binary_factory(index_type):
            faiss.index_binary_factory(64, index_type)
        else:
            faiss.index_factory(64, index_type, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        if "could not parse" in str(e):
            raise ConfigError(
                f"index_type {index_type!r} is not a valid FAISS factory string ({_faiss_reason(e)}); use "
                f"'auto' or e.g. 'Flat', 'HNSW32', 'IVF1024_HNSW32,Flat', 'OPQ64_256,IVF4096_HNSW32,PQ64x8np'") from None


def min_training_vectors(factory: str) -> int:
    """Fewest vectors `factory` can be trained on (k-means needs >= one point per centroid)."""
    need = 1
    for m in re.finditer(r"B?IVF(\d+)", factory):
        need = max(need, int(m.group(1)))
    for m in re.finditer(r"IMI2x(\d+)", factory):
        need = max(need, 2 ** int(m.group(1)))
    for m in re.finditer(r"PQ\d+(?:x(\d+))?", factory):
        need = max(need, 2 ** int(m.group(1) or 8))
    return need


def resolve_factory(index_type: str, n: int, dim: int, memory_budget_bytes: int, vectors: str = "float32") -> str:
    """The factory string to build now for a collection of `n` vectors.

    A factory that needs more training vectors than the collection holds (an explicit one, or
    `auto`'s SQ8 for int8 vectors of an empty collection) falls back to "Flat" (exact, so search
    stays correct: no hits when empty); it is built as resolved once enough vectors exist.
    """
    factory = auto_factory(n, dim, memory_budget_bytes, vectors) if index_type == "auto" else index_type
    if _needs_training(factory, dim) and n < min_training_vectors(factory):
        return "BFlat" if is_binary_factory(factory) else "Flat"  # the collection warns when it builds this
    return factory


def _new_index(factory: str, dim: int):
    if is_binary_factory(factory):
        return faiss.index_binary_factory(dim, factory)
    return faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)


def _needs_training(factory: str, dim: int) -> bool:
    return not _new_index(factory, dim).is_trained


def _fix_ranges(index: faiss.Index, ranges: Int8Ranges | None) -> None:
    """Give an 8-bit scalar quantizer the collection's calibrated ranges (codes then mean the same
    as the stored ones, whenever the index is rebuilt); IVF then encodes vectors, not residuals."""
    if ranges is None:
        return
    outer = faiss.downcast_index(index)
    ivf = faiss.try_extract_index_ivf(outer)
    core = faiss.downcast_index(outer.storage) if isinstance(outer, faiss.IndexHNSW) else outer
    if ivf is not None:
        core = faiss.downcast_index(ivf)
        core.by_residual = False
    sq = getattr(core, "sq", None)
    if sq is None or sq.qtype != faiss.ScalarQuantizer.QT_8bit:
        return
    faiss.copy_array_to_vector(ranges.faiss_table, sq.trained)
    if ivf is None:  # nothing else to train (an IVF still trains its coarse quantizer)
        core.is_trained = outer.is_trained = index.is_trained = True


def _training_sample(parts: Sequence[tuple[np.ndarray, np.ndarray]], factory: str,
                     memory_budget_bytes: int, seed: int, codec: Codec) -> np.ndarray:
    """A uniform random sample of stored vectors sized for `factory`, as the index takes them."""
    n = sum(len(ids) for _, ids in parts)
    dim = codec.dim
    want = max(_TRAIN_POINTS_PER_CENTROID * min_training_vectors(factory),
               _PQ_MIN_TRAIN if "PQ" in factory else 0)
    # Keep the float32 sample within a quarter of the budget: the index needs the rest.
    want = min(n, want, max(min_training_vectors(factory), memory_budget_bytes // (16 * dim)))
    rows = np.sort(np.random.default_rng(seed).choice(n, size=want, replace=False))
    sample, start = [], 0
    for vectors, ids in parts:
        local = rows[(rows >= start) & (rows < start + len(ids))] - start
        if len(local):
            sample.append(_as_input(vectors[local], codec, is_binary_factory(factory)))
        start += len(ids)
    return np.concatenate(sample)


def _as_input(codes: np.ndarray, codec: Codec, binary: bool) -> np.ndarray:
    """Stored codes -> what the index adds: packed bits for a binary index, else float32."""
    return np.ascontiguousarray(codec.bits(codes) if binary else codec.decode(codes))


def build_index(factory: str, dim: int, parts: Sequence[tuple[np.ndarray, np.ndarray]],
                memory_budget_bytes: int, seed: int = 0, codec: Codec | None = None):
    """Train (on a sample) and fill an IndexIDMap2(`factory`) (IndexBinaryIDMap2 for a binary
    factory) with every (codes, ids) part.

    Args: parts: [(codes [n_i, width] in `codec`'s stored precision, ids [n_i] int64)], ids unique;
        codec: how the parts are stored (None: float vectors of width `dim`); its int8 ranges, when
        set, are the ranges of an SQ8 index too.
    Raises CollectionError when FAISS fails to train (message names the factory string).
    """
    codec = codec or Codec("float32", dim)
    binary = is_binary_factory(factory)
    inner = _new_index(factory, dim)
    if not binary:
        _fix_ranges(inner, codec.ranges)
    index = faiss.IndexBinaryIDMap2(inner) if binary else faiss.IndexIDMap2(inner)
    core = faiss.downcast_index(index.index) if not binary else None
    if isinstance(core, faiss.IndexHNSW):
        core.hnsw.efConstruction = 40  # faiss default, stated: build time is linear in it
    parts = [(v, i) for v, i in parts if len(i)]
    if not index.is_trained:
        if not parts:
            raise CollectionError(f"index {factory!r} needs training but there are no vectors")
        sample = _training_sample(parts, factory, memory_budget_bytes, seed, codec)
        log.info("training %s on %d vectors", factory, len(sample))
        try:
            index.train(sample)
        except RuntimeError as e:
            raise CollectionError(f"training FAISS index {factory!r} on {len(sample)} vectors "
                                  f"failed ({str(e).strip().splitlines()[-1]}); choose a "
                                  f"smaller index or 'auto'") from None
        if not binary:
            _fix_ranges(index.index, codec.ranges)  # training fitted its own ranges: the collection's win
    reserve(index, sum(len(ids) for _, ids in parts))
    for vectors, ids in parts:
        add_vectors(index, vectors, ids, codec)
    return index


def reserve(index, n: int) -> bool:
    """Allocate the codes of `n` vectors up front in an empty flat-codes index (Flat, SQ8, SQfp16:
    one array of n x code_size bytes). Filled chunk by chunk, that array grows by doubling, and the
    doubling from 4 to 8 GB holds both copies at once: 12 GB at the peak for a million float32
    2048-d vectors instead of 8 (docs/benchmarks-log.md). Growing it to n and back to 0 keeps its
    capacity (std::vector). Returns whether it did (other index kinds grow their own structures)."""
    core = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap2) else index
    if is_binary(index) or not isinstance(core, faiss.IndexFlatCodes) or core.ntotal or n <= 0:
        return False
    core.codes.resize(n * core.code_size)
    core.codes.resize(0)
    return True


def is_binary(index) -> bool:
    return isinstance(index, faiss.IndexBinary)


def add_vectors(index, vectors: np.ndarray, ids: np.ndarray, codec: Codec | None = None,
                chunk_rows: int = 16_384) -> None:
    """Add stored codes in chunks (decoded by `codec`; None: float vectors) so a memory-mapped
    part is never materialised as float32 whole."""
    codec = codec or Codec("float32", index.d)
    for start in range(0, len(ids), chunk_rows):
        x = _as_input(vectors[start:start + chunk_rows], codec, is_binary(index))
        index.add_with_ids(x, np.ascontiguousarray(ids[start:start + chunk_rows], dtype=np.int64))


def flat_storage(index) -> faiss.IndexFlat | None:
    """The IndexFlat holding an index's vectors as float32 (a Flat index itself, or the storage of
    an HNSW*Flat graph, inside an IndexIDMap2), or None for any other kind."""
    if is_binary(index):
        return None
    core = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap2) else index
    if isinstance(core, faiss.IndexHNSW):
        core = faiss.downcast_index(core.storage)
    return core if isinstance(core, faiss.IndexFlat) else None


def flat_rows(flat: faiss.IndexFlat) -> np.ndarray:
    """The vectors [n, d] float32 of an IndexFlat as a view of its memory (no copy): valid until the
    index is added to (its buffer may move), so take it afresh for each search."""
    return faiss.rev_swig_ptr(flat.get_xb(), flat.ntotal * flat.d).reshape(flat.ntotal, flat.d)


def search_parameters(index: faiss.Index, k: int, nprobe: int | None,
                      ef_search: int | None) -> faiss.SearchParameters | None:
    """Per-call search parameters for the index kind (no global state on the index object).

    HNSW: efSearch = max(ef_search, k) since HNSW cannot return more than efSearch results.
    IVF: nprobe defaults to nlist/16 clamped to [8, 256] (~0.9+ recall on real embeddings).
    """
    ef = max(ef_search or DEFAULT_EF_SEARCH, k)
    if is_binary(index):
        core = faiss.downcast_IndexBinary(index.index) if isinstance(index, faiss.IndexBinaryIDMap2) else index
        if isinstance(core, faiss.IndexBinaryIVF):
            probe = nprobe or min(core.nlist, max(8, min(256, core.nlist // 16)))
            return faiss.SearchParametersIVF(nprobe=min(probe, core.nlist))
        return None
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        probe = nprobe or min(ivf.nlist, max(8, min(256, ivf.nlist // 16)))
        params = faiss.SearchParametersIVF(nprobe=min(probe, ivf.nlist))
        if isinstance(faiss.downcast_index(ivf.quantizer), faiss.IndexHNSW):
            params.quantizer_params = faiss.SearchParametersHNSW(efSearch=max(ef, probe))
        return params
    core = index
    while isinstance(core, (faiss.IndexIDMap2, faiss.IndexIDMap, faiss.IndexPreTransform)):
        core = faiss.downcast_index(core.index)
    if isinstance(core, faiss.IndexHNSW):
        return faiss.SearchParametersHNSW(efSearch=ef)
    return None


def to_search_device(index: faiss.Index) -> faiss.Index:
    """A GPU copy when GPU FAISS and a GPU are present and the index kind is supported."""
    if is_binary(index):
        return index  # binary indexes are searched on the CPU
    if not hasattr(faiss, "index_cpu_to_all_gpus") or faiss.get_num_gpus() == 0:
        return index
    try:
        return faiss.index_cpu_to_all_gpus(index)
    except RuntimeError as e:  # e.g. HNSW has no GPU implementation
        log.info("searching on CPU: this index cannot move to the GPU (%s)", e)
        return index


def save_index(index: faiss.Index, path: Path) -> str:
    """Stream the index into an atomic write (serialize_index would hold two extra copies);
    returns the sha256 of the bytes written, which the manifest records."""
    digest = hashlib.sha256()

    def write(f) -> None:
        def chunk(data: bytes) -> int:
            digest.update(data)
            return f.write(data)
        writer = faiss.PyCallbackIOWriter(chunk)
        (faiss.write_index_binary if is_binary(index) else faiss.write_index)(index, writer)

    atomic_write(path, write)
    return digest.hexdigest()


def file_sha256(path: Path) -> str | None:
    """sha256 of a file's bytes, streamed; None when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def load_index(path: Path, binary: bool = False):
    """The index stored at `path` (`binary`: a binary index), or None if it is missing or
    unreadable (it is derived data)."""
    try:
        # read_index returns the concrete type and owns it; never wrap it in downcast_index (the
        # proxy would not own the index, which would be freed with the temporary).
        return (faiss.read_index_binary if binary else faiss.read_index)(str(path))
    except (OSError, RuntimeError) as e:
        if path.exists():
            log.warning("%s is unreadable (%s); it will be rebuilt from the vectors", path, e)
        return None
