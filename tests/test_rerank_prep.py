"""A reranker's preprocessing of candidates: pairs are counted before they are rendered
(`planned_size` equals the serialized pair, official truncation included), so a query's first batch
waits only for its own pages and the server counts a request's tokens from image headers and page
boxes; and a file's resized image is kept across queries (`ResizedImages`), so a later query over
the same pages renders none of them."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from faste_mm import BatchingConfig, Item
from faste_mm.model.rerank.pair_format import rerank_serializer_config
from faste_mm.model.rerank.reranker import Reranker
from faste_mm.model.rerank.resized_images import ResizedImages

from tests.helpers.rerank_fixtures import ONE_BATCH, reranker_dirs, text_reranker, vl_reranker  # noqa: F401


def _documents(image_dir) -> list[Item]:
    return [
        Item(image=image_dir / "doc.pdf", page=1, max_pixels=60_000),
        Item(image=image_dir / "doc.pdf", page=2, text="a landscape page with a caption"),
        Item(image=image_dir / "red.png"),
        Item(image=image_dir / "green_rgba.png", text="words " * 90),
        Item(image=Image.new("RGB", (50, 700), (9, 9, 9)), text="a tall strip"),
    ]


@pytest.mark.parametrize("max_length", [8192, 300, 40])  # 300 and 40 truncate; at 40 the image tokens alone exceed it
@pytest.mark.parametrize("query", ["text", "image"])
def test_planned_size_equals_the_serialized_pair(vl_reranker, image_dir, max_length, query):
    reranker = Reranker(vl_reranker.loaded, serializer=rerank_serializer_config(max_length), batching=ONE_BATCH)
    asked = "which page is landscape? " * 12 if query == "text" else Item(image=image_dir / "gray.jpg", text="like this")
    prepared = reranker.prepare_query(asked)
    truncated = 0
    for document in _documents(image_dir):
        pair = reranker.serializer(prepared, document)
        assert reranker.serializer.planned_size(prepared, document) == (pair.length, pair.pixel_values.numel() * 4), document
        assert reranker.pair_tokens(prepared, document) == pair.length
        truncated += pair.truncated
    assert (truncated > 0) == (max_length < 8192)


def test_text_and_video_pairs_are_serialized_to_be_counted(vl_reranker, text_reranker, tmp_path):
    from tests.helpers.inputs import write_video

    prepared = vl_reranker.prepare_query("a moving bar")
    clip = write_video(tmp_path / "clip.mp4", 4, 5)
    for document in (Item(text="only words"), Item(video=clip)):
        assert vl_reranker.serializer.planned_size(prepared, document) is None
        assert vl_reranker.pair_tokens(prepared, document) == vl_reranker.serializer(prepared, document).length
    prepared = text_reranker.prepare_query("a query")
    assert text_reranker.serializer.planned_size(prepared, Item(text="a passage")) is None
    assert text_reranker.pair_tokens(prepared, Item(text="a passage")) == text_reranker.serializer(prepared, Item(text="a passage")).length


@pytest.mark.parametrize("prefix_reuse", [False, True])
def test_the_first_batch_waits_only_for_its_own_pages(vl_reranker, image_dir, monkeypatch, prefix_reuse):
    """Pages are rendered batch by batch: when the first batch is scored only its pages were
    serialized (not the first chunk's 16), and the scores equal a reranker that serializes to plan."""
    pages = [Item(image=image_dir / "doc.pdf", page=1 + i % 2, max_pixels=60_000) for i in range(20)]
    in_caller = BatchingConfig(batch_tokens=700, workers=0)  # ~3 pairs a batch, serialized in this thread
    reranker = Reranker(vl_reranker.loaded, batching=in_caller, prefix_reuse=prefix_reuse, tower_cache_bytes=0)
    seen = []
    monkeypatch.setattr(reranker, "serializer", _Counting(reranker.serializer, seen))
    at_first_batch = []
    result = reranker.score("which page is landscape?", pages, progress=lambda n: at_first_batch.append((n, len(seen))))
    first_size, serialized_by_then = at_first_batch[0]
    assert 1 <= first_size < 16 and serialized_by_then == first_size
    assert len(at_first_batch) > 2 and len(seen) == len(pages)  # each page rendered once, several batches

    unplanned = Reranker(vl_reranker.loaded, batching=in_caller, prefix_reuse=prefix_reuse, tower_cache_bytes=0)
    monkeypatch.setattr(unplanned.serializer, "planned_size", lambda *args: None)
    np.testing.assert_allclose(result.scores, unplanned.score("which page is landscape?", pages).scores, atol=1e-6)


class _Counting:
    """The reranker's pair serializer, recording each pair it serializes (the query's own
    serialization for the prefix is an empty-text pair, not counted)."""

    def __init__(self, inner, seen: list) -> None:
        self._inner, self._seen = inner, seen

    def __call__(self, query, document):
        if document.has_image:
            self._seen.append(document)
        return self._inner(query, document)

    def keyed(self, query, document):
        return self(query, document), None

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _counting_resizes(reranker, monkeypatch) -> list:
    resized, prepare = [], reranker.serializer.media.prepare_image
    monkeypatch.setattr(reranker.serializer.media, "prepare_image", lambda item: resized.append(item) or prepare(item))
    return resized


def test_a_later_query_over_the_same_files_resizes_none_of_them(vl_reranker, image_dir, tmp_path, monkeypatch):
    photo = tmp_path / "photo.png"
    Image.new("RGB", (120, 80), (10, 200, 30)).save(photo)
    documents = [Item(image=image_dir / "doc.pdf", page=1, max_pixels=60_000), Item(image=image_dir / "doc.pdf", page=2, max_pixels=60_000),
                 Item(image=photo, text="green"), Item(image=Image.new("RGB", (64, 64)), text="in memory")]
    reranker = Reranker(vl_reranker.loaded, batching=ONE_BATCH)
    plain = Reranker(vl_reranker.loaded, batching=ONE_BATCH, tower_cache_bytes=0)
    assert plain.resized_images is None
    resized = _counting_resizes(reranker, monkeypatch)
    first = reranker.score("a green photo", documents).scores
    assert len(resized) == 4
    second = reranker.score("which page is landscape?", documents).scores
    assert resized[4:] == [documents[3]]  # only the in-memory image, which has no file identity
    np.testing.assert_allclose(second, plain.score("which page is landscape?", documents).scores, atol=1e-6)
    np.testing.assert_allclose(first, plain.score("a green photo", documents).scores, atol=1e-6)

    Image.new("RGB", (96, 160), (200, 10, 10)).save(photo)  # rewritten: another size and modification time
    rewritten = reranker.score("a green photo", documents).scores
    rewritten_resizes = resized[5:]  # the prep threads resize them in either order
    assert len(rewritten_resizes) == 2 and documents[2] in rewritten_resizes and documents[3] in rewritten_resizes
    np.testing.assert_allclose(rewritten, plain.score("a green photo", documents).scores, atol=1e-6)
    assert abs(rewritten[2] - first[2]) > 1e-6


def test_resized_images_are_bounded_by_bytes_least_recently_used_out_first(tmp_path):
    paths = []
    for index in range(3):
        paths.append(tmp_path / f"{index}.png")
        Image.new("RGB", (10, 10), (index, 0, 0)).save(paths[-1])
    kept = ResizedImages(max_bytes=2 * 10 * 10 * 3)  # two 10 x 10 RGB images
    made = []
    get = lambda i: kept.get(Item(image=paths[i]), (1, 100), lambda: made.append(i) or Image.open(paths[i]).convert("RGB"))  # noqa: E731
    for index in (0, 1, 0, 2, 0, 1):
        get(index)
    assert made == [0, 1, 2, 1]  # 1 was least recently used when 2 came
    assert kept.nbytes == 600 and (kept.hits, kept.misses) == (2, 4)
    assert ResizedImages(max_bytes=10).get(Item(image=paths[0]), (1, 100), lambda: Image.new("RGB", (10, 10))).size == (10, 10)


def test_bytes_lru_makes_a_value_only_when_it_keeps_it_and_a_get_refreshes_it():
    from faste_mm.model.rerank.bytes_lru import BytesLRU

    lru, made = BytesLRU(max_bytes=10), []
    make = lambda value: lambda: made.append(value) or value  # noqa: E731
    lru.keep("a", 4, make("a"))
    lru.keep("a", 4, make("again"))  # kept already
    lru.keep("huge", 11, make("huge"))  # over the bound alone
    lru.keep("b", 4, make("b"))
    assert lru.get("a") == "a"  # now the most recently used: "b" goes first
    lru.keep("c", 4, make("c"))
    assert made == ["a", "b", "c"] and lru.get("b") is None and list(lru.values()) == ["a", "c"] and lru.nbytes == 8


def test_a_variant_shares_the_caches_and_scores_as_its_own_reranker(vl_reranker, image_dir, monkeypatch):
    """`Reranker.variant`: another FastE / protect setting over the same caches (the evaluators and
    benchmarks compare settings on the same candidates): after one setting scored the pages, the
    other runs no tower and resizes nothing, and scores as a reranker built with that setting alone."""
    from faste_mm.model.faste import FastEConfig

    pages = [Item(image=image_dir / "doc.pdf", page=page, max_pixels=60_000) for page in (1, 2)] + [Item(image=image_dir / "red.png")]
    base = Reranker(vl_reranker.loaded, batching=ONE_BATCH)
    base.score("a first query", pages)
    setting = base.variant(fast_e=FastEConfig(r_max=0.5, trigger_layer=2), protect="query")
    assert setting.tower_cache is base.tower_cache and setting.resized_images is base.resized_images
    towered, resized = [], _counting_resizes(setting, monkeypatch)
    tower = vl_reranker.backbone.encode_vision
    monkeypatch.setattr(vl_reranker.backbone, "encode_vision",  # a batch with pixels: the query's text prefix has none
                        lambda batch: (batch.pixel_values is not None and towered.append(batch)) or tower(batch))
    scores = setting.score("which page is landscape?", pages).scores
    assert towered == [] and resized == []
    alone = Reranker(vl_reranker.loaded, fast_e=FastEConfig(r_max=0.5, trigger_layer=2), protect="query", batching=ONE_BATCH,
                     tower_cache_bytes=0)
    np.testing.assert_allclose(scores, alone.score("which page is landscape?", pages).scores, atol=1e-6)
