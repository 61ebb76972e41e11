"""A stored file swapped for a link between its check and its read (the race `retrieval.stored_files`
closes): the seam `stored_files.AFTER_CHECK` runs right after the file passed the checks on its
open descriptor, and the test plants a link to an outside file there, at exactly that moment.

What must hold, through the real server (thumbnail, preview, /explain by document_id, search with
rerank) and the Python API: the outside content is never served. The answer to the raced request
is the ORIGINAL file's content (200), because the decoder reads the descriptor that passed the
check, which still holds the indexed inode (unlinking a name does not change an open file); the
next request sees the link at check time and is refused (409). Before the fix, images, PDF pages
and videos were reopened by path after the check and the outside file was served.
"""

from __future__ import annotations

import io
import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from PIL import Image  # noqa: E402

from faste_mm import BatchingConfig, Embedder, Retriever  # noqa: E402
from faste_mm.indexers import Collection  # noqa: E402
from faste_mm.indexers.records import ItemRecord  # noqa: E402
from faste_mm.model.file_decoding import load_image
from faste_mm.model.items import Item  # noqa: E402
from faste_mm.model.video import VideoConfig, read_video  # noqa: E402
from faste_mm.retrieval import stored_files  # noqa: E402
from faste_mm.retrieval.stored_files import ReplacedFileError, stored_item  # noqa: E402
from faste_mm.serving import ServeConfig, ServeEngine, create_app  # noqa: E402
from faste_mm.serving.previews import PREVIEW_PX  # noqa: E402
from faste_mm.serving.thumbnails import THUMBNAIL_PX, jpeg, thumbnail  # noqa: E402
from tests.helpers.inputs import tiny_vl_dir, write_video  # noqa: E402
from tests.helpers.rerank_fixtures import reranker_dirs, vl_reranker  # noqa: E402, F401
from tests.helpers.serve_fixtures import scene_image  # noqa: E402

RED = (230, 10, 10)  # the outside picture: one flat colour, unlike any scene


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> Embedder:
    return Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu",
                                    batching=BatchingConfig(batch_tokens=1 << 16))


@pytest.fixture(scope="module")
def shared(embedder, tmp_path_factory) -> Path:
    """An indexed folder (a picture, a two-page PDF, a note) and, outside it, a red picture and a
    red PDF that a writer of the folder would like the server to show."""
    root = tmp_path_factory.mktemp("race")
    folder = root / "shared"
    folder.mkdir()
    scene_image(folder / "sunset.png", 1)
    scene_image(folder / "forest.png", 2)
    pages = [Image.new("RGB", (200, 260), (255, 255, 255)), Image.new("RGB", (260, 200), (40, 90, 200))]
    pages[0].save(folder / "report.pdf", "PDF", save_all=True, append_images=pages[1:])
    (folder / "note.txt").write_text("minutes of the garden committee meeting")
    Image.new("RGB", (160, 120), RED).save(root / "outside.png")
    Image.new("RGB", (200, 260), RED).save(root / "outside.pdf", "PDF")
    Retriever(embedder, collection=root / "col").index([folder])
    return root


@pytest.fixture(scope="module")
def client(embedder, vl_reranker, shared):
    engine = ServeEngine(embedder, Retriever(embedder, collection=shared / "col"), ServeConfig(), reranker=vl_reranker)
    with TestClient(create_app(engine), base_url="http://127.0.0.1:8000", raise_server_exceptions=False) as client:
        yield client


def _records(shared: Path) -> dict[tuple[str, int | None], ItemRecord]:
    with Collection.open(shared / "col") as col:
        return {(Path(r.uri).name, r.page): r for chunk, _ in col.iter_live() for r in chunk}


@contextmanager
def swapped_at_check(path: Path, outside: Path):
    """Within the block, the first check of `path`'s item is followed at once (the seam) by `path`
    becoming a link to `outside`; afterwards the indexed file (same inode) is put back."""
    keep = path.with_name(path.name + ".kept")
    swaps = []

    def swap(record) -> None:
        if record.uri == str(path) and not swaps:
            os.link(path, keep)  # the indexed inode lives on, to be put back after the test
            path.unlink()
            path.symlink_to(outside)
            swaps.append(record.id)

    stored_files.AFTER_CHECK = swap
    try:
        yield swaps
    finally:
        stored_files.AFTER_CHECK = None
        if swaps:
            os.replace(keep, path)


def _thumbnail_of(path: Path, page: int | None, longest_px: int) -> bytes:
    return jpeg(load_image(Item(image=path, page=page), max_pixels=4 * longest_px * longest_px), longest_px)


@pytest.mark.parametrize("name, page, outside", [("sunset.png", None, "outside.png"),
                                                 ("report.pdf", 1, "outside.pdf")])
def test_thumbnail_and_preview_serve_the_checked_file_never_the_planted_link(client, shared, name, page, outside):
    record = _records(shared)[(name, page)]
    path, outside = shared / "shared" / name, shared / outside
    original = {"thumbnails": _thumbnail_of(path, page, THUMBNAIL_PX), "previews": _thumbnail_of(path, page, PREVIEW_PX)}
    planted = {"thumbnails": _thumbnail_of(outside, page, THUMBNAIL_PX),
               "previews": _thumbnail_of(outside, page, PREVIEW_PX)}
    for route in ("thumbnails", "previews"):
        with swapped_at_check(path, outside) as swaps:
            raced = client.get(f"/{route}/{record.id}")
            assert swaps == [record.id]
            after = client.get(f"/{route}/{record.id}")
        assert raced.status_code == 200, raced.text
        assert raced.content != planted[route], f"/{route} served the file planted after the check"
        assert raced.content == original[route]
        assert after.status_code == 409, after.text  # the link is seen at the next check


def test_explain_by_document_id_reads_the_checked_picture(client, shared):
    record = _records(shared)[("sunset.png", None)]
    path = shared / "shared" / "sunset.png"
    body = {"query": "a red square", "document_id": record.id}
    before = client.post("/explain", json=body)
    assert before.status_code == 200, before.text
    with swapped_at_check(path, shared / "outside.png") as swaps:
        raced = client.post("/explain", json=body)
        assert swaps == [record.id]
        after = client.post("/explain", json=body)
    assert raced.status_code == 200, raced.text
    assert raced.json() == before.json()  # the same picture read: the indexed one
    assert after.status_code == 409, after.text


def _sunset_rerank_score(hits) -> float | None:
    return next(h.get("rerank_score") for h in hits if Path(h["uri"]).name == "sunset.png")


def test_search_rerank_scores_the_checked_picture(client, vl_reranker, shared):
    body = {"query": "a red square", "k": 5, "rerank": True}
    path = shared / "shared" / "sunset.png"
    vl_reranker.resized_images.clear()  # the raced read goes to the file, not to a kept image
    before = client.post("/search", json=body)
    assert before.status_code == 200, before.text
    vl_reranker.resized_images.clear()
    with swapped_at_check(path, shared / "outside.png") as swaps:
        raced = client.post("/search", json=body)
        assert swaps
        after = client.post("/search", json=body)
    assert raced.status_code == 200 and after.status_code == 200
    assert _sunset_rerank_score(raced.json()["hits"]) == pytest.approx(_sunset_rerank_score(before.json()["hits"]))
    assert _sunset_rerank_score(after.json()["hits"]) is None  # refused at its check, not scored


def test_python_api_reads_the_checked_file(embedder, vl_reranker, shared):
    records = _records(shared)
    for (name, page), outside in ((("sunset.png", None), "outside.png"), (("report.pdf", 2), "outside.pdf")):
        path = shared / "shared" / name
        expected = np.asarray(load_image(Item(image=path, page=page), max_pixels=1 << 20))
        with swapped_at_check(path, shared / outside) as swaps:
            item = stored_item(records[(name, page)])
            assert swaps
            read = np.asarray(load_image(item, max_pixels=1 << 20))
            with pytest.raises(ReplacedFileError):
                stored_item(records[(name, page)])
        assert np.array_equal(read, expected), f"{name}: not the indexed file's pixels"
    retriever = Retriever(embedder, collection=shared / "col")
    vl_reranker.resized_images.clear()
    before = {Path(h.uri).name: h.rerank_score for h in retriever.search("a red square", k=5, rerank=vl_reranker)}
    vl_reranker.resized_images.clear()
    with swapped_at_check(shared / "shared" / "sunset.png", shared / "outside.png"):
        raced = {Path(h.uri).name: h.rerank_score for h in retriever.search("a red square", k=5, rerank=vl_reranker)}
    assert raced["sunset.png"] == pytest.approx(before["sunset.png"])


def test_video_is_decoded_from_the_checked_descriptor(shared, tmp_path):
    """A video (not indexed here: a record with the identity indexing records is what the readers
    receive): its thumbnail frame and the frames a reranker samples come from the checked file."""
    video, outside = write_video(shared / "shared" / "clip.mp4", 1, 4), write_video(tmp_path / "outside.mp4", 1, 4,
                                                                                   size=(32, 32))
    st = os.stat(video)
    record = ItemRecord(uri=str(video), modality="video", id=99, dev=st.st_dev, ino=st.st_ino)
    config = VideoConfig()
    expected = read_video(video, config).frames
    with swapped_at_check(video, outside):
        frames = read_video(stored_item(record).video, config).frames
    assert frames.shape == expected.shape and bool((frames == expected).all())
    expected_jpeg = thumbnail(record, tmp_path / "plain")
    with swapped_at_check(video, outside):
        raced_jpeg = thumbnail(record, tmp_path / "raced")
        with pytest.raises(ReplacedFileError):
            thumbnail(record, tmp_path / "after")
    assert raced_jpeg == expected_jpeg
    assert Image.open(io.BytesIO(raced_jpeg)).size == Image.open(io.BytesIO(expected_jpeg)).size
