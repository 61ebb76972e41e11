"""Long PDFs: memory bounded in bytes (batches planned from token counts read without pixels,
serialized only when the ready queue has room; the same batches and vectors whatever the
budget) and page-range commits (an interrupted run resumes mid-file, a changed PDF replaces all
its old pages, half a document is never complete)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import weakref
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from faste_mm import BatchingConfig, Embedder, FastEConfig, Item, Retriever
from faste_mm.errors import ConfigError
from faste_mm.indexers.crash_points import CRASH_ENV
from faste_mm.model.batching import plan_batches
from faste_mm.model.items import expand_items
from faste_mm.model.prefetch import ItemError, prefetch_batches
from faste_mm.model.serialization import Serialized, SerializerConfig
from faste_mm.retrieval.results import IndexOptions

from tests.helpers.warm_process import run_cli
from tests.helpers.inputs import noise_image, pdf_of_sizes

PAGE_PIXELS = 32 * 1024  # small pages keep the tiny model fast


SIZES = [(612, 792), (300, 200), (1000, 90), (595.3, 841.9), (72, 72), (612, 792), (200, 300)]


@pytest.fixture(scope="module")
def small_pages(model_dirs) -> Embedder:
    """The tiny model at a small pixel cap and a token budget of a few pages per batch."""
    emb = Embedder.from_pretrained(str(model_dirs["qwen3_vl"]), device="cpu",
                                   serializer=SerializerConfig(max_pixels=PAGE_PIXELS))
    return emb.with_batching(BatchingConfig(batch_tokens=200, chunk_items=5, workers=2))


# ---- memory bounded in bytes ------------------------------------------------------------------
def test_planned_token_counts_equal_the_serialized_lengths(small_pages, tmp_path):
    pdf = pdf_of_sizes(tmp_path / "m.pdf", SIZES, marks=1)
    import pypdfium2 as pdfium

    rotated = pdfium.PdfDocument(str(pdf))
    rotated[1].set_rotation(90)  # the page box turns, and so does the rendered size
    rotated.save(tmp_path / "r.pdf")
    rotated.close()
    items = [Item(image=pdf, page=p) for p in range(1, len(SIZES) + 1)]
    items += [Item(image=tmp_path / "r.pdf", page=2), Item(image=tmp_path / "r.pdf", page=3, text="caption"),
              Item(image=noise_image(tmp_path / "a.png", (333, 517), 1), text="a photo", instruction="Find it"),
              Item(image=noise_image(tmp_path / "b.png", (40, 21), 2, "RGBA"))]
    for embedder in (small_pages, small_pages.with_serializer(SerializerConfig())):
        serializer = embedder.serializer
        for item in items:
            serialized = serializer(item, item.instruction)
            assert serializer.planned_size(item, item.instruction) == (serialized.length,
                                                                      serialized.pixel_values.nbytes), item
            assert serializer.resized_size(item) == serializer.prepare_image(item).size, item
    assert serializer.planned_size(Item(text="only text"), None) is None  # cheaper to serialize


def test_batches_of_large_pages_are_bounded_in_bytes_not_only_in_tokens():
    """Pages near the default pixel cap (~1,800 tokens, 44 MB of float32 patches each): a GPU's
    token budget alone would put 9 in a batch; batch_bytes keeps a batch's planned bytes within it
    (2 pages at the CPU's default), and an item larger than the bound still gets a batch of its own."""
    page_bytes, page_tokens = 44_236_800, 1_812
    config = BatchingConfig(batch_tokens=16384)
    batches = plan_batches([page_tokens] * 9, config, [page_bytes] * 9)
    assert [len(b) for b in batches] == [2, 2, 2, 2, 1]
    assert all(len(b) * page_bytes <= config.byte_budget for b in batches)
    assert len(plan_batches([page_tokens] * 9, config)) == 1  # in tokens alone: one batch of 9
    huge = replace(config, batch_bytes=page_bytes - 1)
    assert plan_batches([page_tokens] * 3, huge, [page_bytes] * 3) == [[0], [1], [2]]
    with pytest.raises(ConfigError, match="batch_bytes"):
        BatchingConfig(batch_bytes=0)


def _batches(embedder: Embedder, items: list[Item]) -> list[list[int]]:
    return [b.rows for b in embedder.prepare_batches(items, list(range(len(items)))) if not isinstance(b, ItemError)]


def test_a_tiny_byte_budget_gives_the_batches_and_vectors_of_a_huge_one(small_pages, tmp_path):
    pdf = pdf_of_sizes(tmp_path / "m.pdf", SIZES, marks=1)
    inputs = [pdf, "a text between the pages", noise_image(tmp_path / "a.png", (90, 60), 3), "more text"]
    fast_e = FastEConfig(r_max=0.5, warmup_layer=1)
    tiny = small_pages.with_batching(replace(small_pages.batching, prefetch_bytes=0))
    huge = small_pages.with_batching(replace(small_pages.batching, prefetch_bytes=1 << 40))
    a, b = tiny.encode(inputs, fast_e=fast_e), huge.encode(inputs, fast_e=fast_e)
    np.testing.assert_array_equal(a.embeddings, b.embeddings)
    assert a.ok.all() and len(a.stats.batches) > 3
    # The batches are the ones of serializing every item of a chunk and sorting them (the
    # planning before byte budgets): same rows, same order.
    items, _, _ = expand_items(inputs)
    lengths = [small_pages.serializer(item, None).length for item in items]
    expected, start, size = [], 0, 5
    while start < len(items):  # chunks of chunk_items (the ramp starts above it here)
        chunk = list(range(start, min(start + size, len(items))))
        expected += [[chunk[i] for i in rows] for rows in plan_batches([lengths[r] for r in chunk], tiny.batching)]
        start += size
    assert _batches(tiny, items) == expected == _batches(huge, items)


def _fake_items(n: int, rows_per_item: int = 1000):
    """serialize/measure callables over n items of 4 KB of pixels per row, recording calls."""
    calls: list[int] = []
    alive: set[int] = set()

    def serialize(index: int) -> Serialized:
        calls.append(index)
        pixels = torch.full((rows_per_item, 1024), float(index))  # [P, C] float32
        alive.add(index)
        weakref.finalize(pixels, alive.discard, index)
        length = 10 + index % 7
        return Serialized(input_ids=torch.arange(length), pixel_values=pixels,
                          image_grid_thw=torch.tensor([[1, 1, rows_per_item]]))

    return serialize, calls, alive


@pytest.mark.parametrize("workers", [0, 2])
def test_prefetch_serializes_a_batch_only_when_the_queue_has_room(workers):
    """40 items of 4 MB each, batches of 4 rows, a zero byte budget: the items alive at any
    time are those of the one batch being prepared, never the chunk's (chunk_items=16) or the
    run's, and each item is serialized once."""
    serialize, calls, alive = _fake_items(40)
    config = BatchingConfig(batch_tokens=64, max_batch_size=4, chunk_items=16, workers=workers, prefetch_bytes=0)
    seen, most_alive = [], 0
    for batch in prefetch_batches(list(range(40)), serialize, config, 0, measure=lambda i: (10 + i % 7, 4 << 20)):
        most_alive = max(most_alive, len(alive))
        seen.append(batch.rows)
        assert batch.pixel_values[:, 0].unique().tolist() == sorted(batch.rows)  # each row's own pixels
    assert sorted(r for rows in seen for r in rows) == list(range(40))
    assert sorted(calls) == list(range(40))  # measured without serializing
    # collate copies each item into its batch and lets it go; with workers the next batch's
    # items are being serialized while the consumer holds a batch, never more than one batch's
    assert most_alive <= (0 if workers == 0 else 4)
    assert max(len(rows) for rows in seen) == 4


def test_items_without_a_planned_length_are_kept_within_the_byte_budget():
    """Without `measure` every item is serialized to learn its length; a budget of 3 items'
    bytes keeps 3 of each chunk and serializes the others again in their batch: the batches
    are those of an unlimited budget."""
    item_bytes = 1000 * 1024 * 4 + 8 * 16  # pixels + the largest ids
    serialize, calls, _ = _fake_items(20)
    small = BatchingConfig(batch_tokens=64, max_batch_size=4, chunk_items=8, workers=0, prefetch_bytes=3 * item_bytes)
    rows_small = [b.rows for b in prefetch_batches(list(range(20)), serialize, small, 0)]
    assert 20 < len(calls) <= 40 - 3 * 2  # chunks of 8, 8, 4: at least 3 kept in each full chunk
    serialize, calls, _ = _fake_items(20)
    big = replace(small, prefetch_bytes=1 << 40)
    assert [b.rows for b in prefetch_batches(list(range(20)), serialize, big, 0)] == rows_small
    assert sorted(calls) == list(range(20))


def test_prefetch_bytes_must_be_a_non_negative_int():
    with pytest.raises(ValueError, match="prefetch_bytes"):
        BatchingConfig(prefetch_bytes=-1)


# ---- page-range commits ------------------------------------------------------------------------
def _rows(col: Path) -> list[tuple]:
    db = sqlite3.connect(col / "meta.sqlite")
    rows = db.execute("SELECT id, uri, page, status, mtime, content_hash FROM items ORDER BY id").fetchall()
    db.close()
    return rows


def _live(col: Path) -> dict[tuple[str, int], tuple]:
    return {(Path(uri).name, page): (i, mtime, digest) for i, uri, page, status, mtime, digest in _rows(col)
            if status == "ok"}


def _vectors(retriever: Retriever) -> dict[tuple[str, int], np.ndarray]:
    from faste_mm.indexers import Collection

    with Collection.open(retriever.collection) as col:
        out = {}
        for records, vectors in col.iter_live():
            out.update({(Path(r.uri).name, r.page): v for r, v in zip(records, vectors)})
    return out


class _StopAfter:
    """A progress callback that interrupts the run (as Ctrl-C would) once `pages` are embedded."""

    def __init__(self, pages: int) -> None:
        self.pages = pages

    def __call__(self, progress) -> None:
        if progress.embedded >= self.pages:
            raise KeyboardInterrupt


@pytest.fixture
def page_retriever(small_pages, tmp_path):
    one_page_batches = small_pages.with_batching(replace(small_pages.batching, batch_tokens=1))

    def make(name: str) -> Retriever:
        return Retriever(one_page_batches, collection=tmp_path / name)

    return make


OPTIONS = IndexOptions(chunk_pages=2)


def test_an_interrupted_long_pdf_resumes_after_its_last_committed_range(page_retriever, tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    pdf = pdf_of_sizes(docs / "a.pdf", SIZES[:5], marks=1)
    run = page_retriever("run")
    with pytest.raises(KeyboardInterrupt):
        run.index([docs], options=OPTIONS, progress=_StopAfter(3))  # inside the second range
    first = _live(run.collection)
    assert sorted(first) == [("a.pdf", 1), ("a.pdf", 2)]
    assert all(mtime is None for _, mtime, _ in first.values())  # not complete yet
    assert run.pending([docs], OPTIONS) == 1  # a re-run must finish the file
    # A copy indexed now embeds every page: half a document is never lent as a whole one.
    copy = shutil.copy(pdf, tmp_path / "copy.pdf")
    assert run.index([copy], options=OPTIONS).embedded == 5
    reference = _vectors(run)
    run.remove([copy])  # else the complete copy would lend a.pdf its vectors
    report = run.index([docs], options=OPTIONS)
    assert (report.embedded, report.failed) == (3, 0)  # pages 3-5 only
    live = _live(run.collection)
    assert {k: v for k, v in live.items() if k[1] <= 2} == {
        k: (i, pdf.stat().st_mtime, d) for k, (i, _, d) in first.items()}  # the same rows, now complete
    assert run.pending([docs], OPTIONS) == 0
    got = _vectors(run)
    assert sorted(got) == [("a.pdf", page) for page in range(1, 6)]
    for page in range(1, 6):  # the same page ranges, so the same batches as the copy's run
        np.testing.assert_array_equal(got[("a.pdf", page)], reference[("copy.pdf", page)])


def test_a_changed_long_pdf_replaces_every_old_page(page_retriever, tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    pdf_of_sizes(docs / "a.pdf", SIZES[:5], marks=1)
    run = page_retriever("run")
    run.index([docs], options=OPTIONS)
    old = _live(run.collection)
    pdf_of_sizes(docs / "a.pdf", SIZES[2:5], marks=2)  # three pages, other content
    os.utime(docs / "a.pdf", (1e9, 1e9))
    assert run.index([docs], options=OPTIONS).embedded == 3
    live = _live(run.collection)
    assert sorted(live) == [("a.pdf", 1), ("a.pdf", 2), ("a.pdf", 3)]
    assert not {i for i, _, _ in live.values()} & {i for i, _, _ in old.values()}
    assert len({d for _, _, d in live.values()} | {d for _, _, d in old.values()}) == 2
    # Interrupted while changed again: the first range replaced all old pages, the rerun finishes
    pdf_of_sizes(docs / "a.pdf", SIZES[:6], marks=3)
    with pytest.raises(KeyboardInterrupt):
        run.index([docs], options=OPTIONS, progress=_StopAfter(3))
    assert sorted(_live(run.collection)) == [("a.pdf", 1), ("a.pdf", 2)]
    assert run.index([docs], options=OPTIONS).embedded == 4
    live = _live(run.collection)
    assert sorted(live) == [("a.pdf", p) for p in range(1, 7)]
    from faste_mm.indexers import content_hash

    assert {(d, m) for _, m, d in live.values()} == {(content_hash(docs / "a.pdf"), (docs / "a.pdf").stat().st_mtime)}


def test_a_run_killed_after_a_page_range_resumes_mid_file(small_pages, tmp_path):
    """SIGKILL at the named step after the first range commits (FASTE_MM_CRASH_AT); the next
    `faste-mm index` embeds only the pages after it."""
    docs = tmp_path / "docs"
    docs.mkdir()
    pdf_of_sizes(docs / "a.pdf", SIZES[:5], marks=1)
    noise_image(docs / "b.png", (40, 40), 5)
    col = tmp_path / "col"
    with Retriever(small_pages, collection=col) as creator:  # the collection's small pixel cap
        creator.index([docs / "b.png"])
    args = ["index", str(docs), "-c", str(col),  # its model and pixel cap
            "--device", "cpu", "--chunk-pages", "2", "--format", "json"]
    # processes of their own, forked warm (tests/helpers/warm_process.py)
    killed = run_cli(args, env={**os.environ, CRASH_ENV: "index-after-page-range"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert sorted(k for k in _live(col) if k[0] == "a.pdf") == [("a.pdf", 1), ("a.pdf", 2)]
    done = run_cli(args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["embedded"] == 3
    live = _live(col)
    assert sorted(live) == [("a.pdf", p) for p in range(1, 6)] + [("b.png", None)]
    assert len([r for r in _rows(col) if r[3] != "ok"]) == 0  # nothing embedded twice, nothing replaced


def _page_vector(page: int) -> np.ndarray:
    vector = np.zeros(4, dtype=np.float32)
    vector[page % 4] = 1.0
    return vector


def _committed(col) -> tuple[list[tuple], list[tuple]]:
    """(page, mtime, vector) of the live rows and (page, mtime, error) of the failure rows."""
    ids = sorted(col.live_ids(range(100)))
    rows = sorted((r.page, r.mtime, tuple(v)) for r, v in zip(col.get(ids), col.vectors(ids)))
    return rows, sorted((r.page, r.mtime, r.error) for r in col.info().failures)


def test_the_ray_driver_commits_page_ranges_as_a_plain_run_does(tmp_path):
    """A long PDF's ranges, committed by a plain run (`ingest_long_pdf`) and by the Ray driver
    (`LongPdf.add_part`, parts in any order, one delivered twice): the same rows and failure
    rows; before the last range, rows without the file's mtime and no failure committed."""
    from faste_mm import EmbedResult
    from faste_mm.indexers import Collection, Manifest
    from faste_mm.model.items import Failure
    from faste_mm.retrieval.ingest import IngestTally, ingest_long_pdf
    from faste_mm.retrieval.scanning import scan_paths
    from faste_mm.scale.ray_pages import plan_long_pdf

    pdf = pdf_of_sizes(tmp_path / "a.pdf", SIZES[:5])
    (f,) = scan_paths([pdf]).files()
    bad_page = 3
    reason = f"{f.uri} (page {bad_page}): could not be embedded"

    def encode(items):  # one row per page; page 3 fails
        pages = [item.page for item in items]
        ok = np.array([page != bad_page for page in pages])
        failures = [Failure(row, row, "", reason) for row, page in enumerate(pages) if page == bad_page]
        return EmbedResult(np.stack([_page_vector(page) * ok[row] for row, page in enumerate(pages)]),
                           list(items), list(range(len(items))), ok, failures)

    manifest = Manifest(model_id="m", dim=4, vector_dtype="float32")
    with Collection.create(tmp_path / "plain", manifest) as col:
        plain_tally = IngestTally()
        ingest_long_pdf(col, f, 5, frozenset(), encode, plain_tally, chunk_pages=2)
        plain = _committed(col)

    def output(pages):
        return dict(pages=pages, vectors=[_page_vector(p) for p in pages], prefix_tokens=0, kept_prefix_tokens=0,
                    reasons=[reason if p == bad_page else None for p in pages])

    with Collection.create(tmp_path / "ray", manifest) as col:
        ray_tally = IngestTally()
        _, long_pdf = plan_long_pdf(col, f, 5, frozenset(), 2, None)
        assert long_pdf.todo == [1, 2, 3, 4, 5]
        assert not long_pdf.add_part(col, 1, 3, output([3, 4]), ray_tally)  # a whole range: committed
        rows, failures = _committed(col)
        assert [(page, mtime) for page, mtime, _ in rows] == [(4, None)] and failures == []
        assert not long_pdf.add_part(col, 1, 3, output([3, 4]), ray_tally)  # delivered twice: ignored
        assert not long_pdf.add_part(col, 2, 3, output([5]), ray_tally)  # buffered (1 page < 2)
        assert long_pdf.add_part(col, 0, 3, output([1, 2]), ray_tally)  # the last part settles the file
        assert _committed(col) == plain
    mtime = f.stat.mtime
    assert plain == ([(p, mtime, tuple(_page_vector(p))) for p in (1, 2, 4, 5)], [(bad_page, mtime, reason)])
    assert (plain_tally.embedded, len(plain_tally.failures)) == (4, 1)
    assert (ray_tally.embedded, ray_tally.failures) == (plain_tally.embedded, plain_tally.failures)


# ---- the Ray decoder ---------------------------------------------------------------------------
def test_the_ray_decoder_renders_a_long_pdf_part_by_part(tmp_path):
    """`index --ray` decoding yields a PDF's pages PAGES_PER_PART at a time (a generator: a part
    is rendered when the previous one has gone on), and the driver joins the parts' outputs in
    page order whatever order they arrive in."""
    from faste_mm.retrieval.profile import CollectionProfile
    from faste_mm.scale.ray_index import _Pending
    from faste_mm.scale.ray_workers import PAGES_PER_PART, FileTask, decode_file_parts

    n_pages = 2 * PAGES_PER_PART + 3
    pdf = pdf_of_sizes(tmp_path / "long.pdf", [(200, 300)] * n_pages)
    profile = CollectionProfile(model_id="tiny", dim=4, max_pixels=4096, min_pixels=4096)
    parts = decode_file_parts(FileTask(str(pdf), "page", None), profile, None, "driver")
    first_rows, n_parts = next(parts)  # only the first part is rendered so far
    assert n_parts == 3 and [row.page for row in first_rows] == list(range(1, PAGES_PER_PART + 1))
    rest = [rows for rows, _ in parts]
    assert [row.page for rows in rest for row in rows] == list(range(PAGES_PER_PART + 1, n_pages + 1))
    assert all(row.reason is None and row.value.size[0] * row.value.size[1] <= 4096 * 1.1
               for rows in [first_rows, *rest] for row in rows)
    waiting = _Pending(prepared=None)
    outputs = [{"pages": [row.page for row in rows], "reasons": [None] * len(rows),
                "vectors": np.full((len(rows), 4), float(i)), "prefix_tokens": i, "kept_prefix_tokens": 1}
               for i, rows in enumerate([first_rows, *rest])]
    for part in (2, 0, 1):
        assert 0 not in waiting.outputs
        waiting.add_part(0, part, 3, outputs[part])
    joined = waiting.outputs[0]
    assert joined["pages"] == list(range(1, n_pages + 1)) and joined["prefix_tokens"] == 3
    np.testing.assert_array_equal(joined["vectors"][:, 0], np.repeat([0.0, 1.0, 2.0], [16, 16, 3]))
