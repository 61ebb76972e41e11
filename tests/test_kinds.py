"""The one table of input kinds: every kind has a decoder on every path that reads files (the
plain `index`, the Ray executor, a query by example, the server's thumbnails), and the paths
agree: a file embeds to the same vector whether the plain path or the Ray decoder read it (the
test that would have caught `index --ray` recording every video as an unreadable image)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from faste_mm import Item
from faste_mm.indexers import ItemRecord, SearchFilter
from faste_mm.kinds import FILTER_TYPES, KINDS, kind_name
from faste_mm.model.items import as_item
from faste_mm.model.video import VideoConfig
from faste_mm.retrieval.decoders import DECODERS, DOCUMENT_INPUTS, QUERY_INPUTS, document_input, query_item
from faste_mm.retrieval.scanning import scan_paths
from faste_mm.retrieval.profile import CollectionProfile
from faste_mm.scale.ray_workers import FileTask, decode_file_parts, embedder_input
from faste_mm.serving.thumbnails import NoThumbnailError, has_thumbnail, thumbnail

from tests.helpers.inputs import noise_image, two_page_pdf
from tests.helpers.inputs import write_video


@pytest.fixture(scope="module")
def one_of_each(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kinds")
    files = {"image": noise_image(root / "photo.png", (40, 32), 7), "pdf": two_page_pdf(root / "doc.pdf"),
             "video": write_video(root / "clip.mp4", 1, 4), "text": root / "note.txt"}
    files["text"].write_text("a note about a red bicycle")
    assert set(files) == set(KINDS), "a kind was added: give this test a file of it"
    return files


def test_every_kind_has_a_decoder_on_every_path():
    for kind in KINDS.values():
        for path, table in (("plain", DOCUMENT_INPUTS), ("ray", DECODERS), ("query", QUERY_INPUTS)):
            assert kind.decoder in table, f"{kind.name}: no {path} decoder"
        assert kind.thumbnail in (None, "image", "page", "frame"), kind.name
        assert kind.filter_type in FILTER_TYPES and kind.modality in FILTER_TYPES[kind.filter_type]
        SearchFilter(types=kind.filter_type)  # a kind's filter type is a valid search filter
    suffixes = [s for kind in KINDS.values() for s in kind.suffixes]
    assert len(suffixes) == len(set(suffixes)) and all(s == s.lower() and s.startswith(".") for s in suffixes)


def test_scanning_gives_each_file_its_kind_and_stored_modality(one_of_each):
    scan = scan_paths(list(one_of_each.values()))
    assert {f.kind: f.modality for f in scan.files()} == {k: KINDS[k].modality for k in one_of_each}
    assert kind_name(Path("A.JPEG")) == "image" and kind_name(Path("x.docx")) == "unsupported"


def test_the_ray_decoder_and_the_plain_path_embed_every_kind_alike(one_of_each, vl_embedder, tmp_path):
    """Plain: the embedder decodes `document_input` itself. Ray: the CPU task's `decode_file_parts`
    rows, as the actor turns them into items. Same rows, same vectors, with the same profile."""
    profile = CollectionProfile(video=VideoConfig(fps=4.0, max_frames=4))
    embedder = vl_embedder.with_serializer(profile.serializer(vl_embedder.serializer.config))
    for kind, path in one_of_each.items():
        plain = embedder.encode_documents([document_input(path, kind)], on_error="skip")
        value = document_input(path, kind) if kind == "text" else None
        parts = list(decode_file_parts(FileTask(str(path), KINDS[kind].modality, value), profile, None, driver_node="here"))
        assert all(n == len(parts) for _, n in parts), kind  # each part says how many there are
        rows = [row for decoded, _ in parts for row in decoded]
        assert [row.reason for row in rows] == [None] * len(rows), kind
        items = [embedder_input(row, tmp_path / f"{kind}{i}") for i, row in enumerate(rows)]
        ray = embedder.encode_documents(items, on_error="skip")
        assert not plain.failures and not ray.failures, kind
        assert [it.page for it in plain.items] == [row.page for row in rows], kind
        np.testing.assert_allclose(ray.embeddings, plain.embeddings, atol=1e-5, err_msg=kind)


def test_every_kind_makes_a_query(one_of_each, vl_embedder):
    queries = [query_item(path, kind, page=1) for kind, path in one_of_each.items()]
    assert [q.video is not None for q in queries] == [kind == "video" for kind in one_of_each]
    result = vl_embedder.encode_queries(queries, instruction="Find it.")
    assert result.ok.all() and np.isfinite(result.embeddings).all()


def test_the_server_pictures_each_kind_by_its_thumbnail_rule(one_of_each, tmp_path):
    for kind, path in one_of_each.items():
        page = 1 if kind == "pdf" else None
        record = ItemRecord(uri=str(path), modality=KINDS[kind].modality, page=page, size=1, mtime=1.0, id=1)
        assert has_thumbnail(record.uri, page) == (KINDS[kind].thumbnail is not None), kind
        if KINDS[kind].thumbnail is None:
            with pytest.raises(NoThumbnailError):
                thumbnail(record, tmp_path)
        else:
            assert thumbnail(record, tmp_path)[:2] == b"\xff\xd8"  # a JPEG
    assert not has_thumbnail("item:0123", None)
    assert Item(image=one_of_each["pdf"]).is_pdf and as_item(one_of_each["video"], 0).video is not None
