"""Facts read at scan time without a model (retrieval/library/photo_metadata.py): EXIF, XMP, IPTC, a PDF's
info, a video's tags, offline place names; hostile values leave a field empty with a counted reason;
stored typed (schema 7) and searchable by words; a re-scan fills an older collection's facts
without embedding anything."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image, PngImagePlugin, TiffImagePlugin

from faste_mm.errors import InputError
from faste_mm.indexers import Collection
from faste_mm.indexers.facts import ItemFacts
from faste_mm.model.embedder import Embedder
from faste_mm.retrieval.library.photo_metadata import read_facts
from faste_mm.retrieval.retriever import Retriever

from tests.helpers.old_schemas import downgrade
from tests.helpers.photo_fixtures import BILLION_LAUGHS, exif_block, iptc_segment, make_photo, xmp_packet
from tests.helpers.inputs import tiny_vl_dir

LISBON = (38.7223, -9.1393, 12.5)


def beach_photo(path: Path, seed: int = 0) -> Path:
    return make_photo(path, seed, exif=exif_block("2024:05:01 14:03:00", "+01:00", "Google", "Pixel 8",
                                                  "Pixel 8 back camera", LISBON, orientation=6),
                      xmp=xmp_packet("Beach day", "Sunset over the sea", ("beach", "sunset"), rating=4),
                      iptc=iptc_segment("Praia", "caption", ("holiday", "beach")))


def test_a_camera_jpeg_gives_every_field_with_the_date_as_a_utc_instant_and_its_offset(tmp_path):
    facts = read_facts(beach_photo(tmp_path / "a.jpg"), "image")
    # 14:03 at UTC+01:00 is 13:03 UTC
    assert facts.taken == datetime(2024, 5, 1, 13, 3, tzinfo=timezone.utc).timestamp()
    assert (facts.taken_offset_min, facts.taken_source) == (60, "exif")
    assert facts.taken_iso() == "2024-05-01T14:03:00+01:00"
    assert (facts.camera, facts.lens, facts.orientation, facts.width, facts.height) == (
        "Google Pixel 8", "Pixel 8 back camera", 6, 64, 48)
    assert facts.lat == pytest.approx(LISBON[0], abs=1e-4) and facts.lon == pytest.approx(LISBON[1], abs=1e-4)
    assert facts.alt == pytest.approx(12.5)
    assert (facts.region, facts.country) == ("Lisbon", "Portugal") and facts.city
    # XMP first (title, description), IPTC adds the keywords XMP lacks
    assert (facts.title, facts.description, facts.rating) == ("Beach day", "Sunset over the sea", 4)
    assert facts.keywords == ("beach", "sunset", "holiday")
    assert facts.issues == ()
    d = facts.to_dict()
    assert d["taken"] == "2024-05-01T14:03:00+01:00" and d["place"].endswith("Lisbon, Portugal")


def test_without_a_date_in_the_file_the_photo_is_undated_whatever_its_mtime(tmp_path):
    path = make_photo(tmp_path / "plain.jpg")
    os.utime(path, (1_700_000_000, 1_700_000_000))
    facts = read_facts(path, "image")
    assert (facts.taken, facts.taken_source, facts.taken_offset_min) == (None, None, None)
    assert facts.taken_iso() is None and facts.to_dict()["taken"] is None


def test_iptc_alone_gives_title_caption_and_keywords(tmp_path):
    facts = read_facts(make_photo(tmp_path / "i.jpg", iptc=iptc_segment("Praia", "Na praia", ("mar", "areia"))),
                       "image")
    assert (facts.title, facts.description, facts.keywords) == ("Praia", "Na praia", ("mar", "areia"))


def _nan_gps():
    zero = TiffImagePlugin.IFDRational(1, 0)  # a zero denominator: reads as nan
    return {1: "N", 2: (zero, zero, zero), 3: "E", 4: (1.0, 0.0, 0.0)}


def _big_xmp_png(path: Path) -> Path:
    info = PngImagePlugin.PngInfo()
    info.add_itxt("XML:com.adobe.xmp", "<x:xmpmeta>" + " " * (600 << 10) + "</x:xmpmeta>")
    Image.new("RGB", (8, 8)).save(path, pnginfo=info)
    return path


@pytest.mark.parametrize("make, empty, issue", [
    (lambda p: make_photo(p, xmp=BILLION_LAUGHS.encode()), "keywords", "xmp refused (DTD or entities)"),
    (lambda p: _big_xmp_png(p.with_suffix(".png")), "title", "xmp over 256 KiB"),
    (lambda p: make_photo(p, exif=exif_block("0000:00:00 00:00:00")), "taken_offset_min", "exif date unreadable"),
    (lambda p: make_photo(p, exif=exif_block("9999:12:31 23:59:59", "+01:00")), "taken_offset_min",
     "exif date out of range"),
    (lambda p: make_photo(p, exif=exif_block(raw_gps=_nan_gps())), "lat", "gps out of range"),
    (lambda p: make_photo(p, exif=exif_block(gps=(91.0, 0.0, 0.0))), "lat", "gps out of range"),
    (lambda p: make_photo(p, xmp=xmp_packet(rating=99)), "rating", "xmp rating out of range"),
    (lambda p: make_photo(p, xmp=b"<x:xmpmeta><unclosed>"), "title", "xmp unreadable"),
])
def test_hostile_metadata_leaves_the_field_empty_and_names_the_reason(tmp_path, make, empty, issue):
    path = make(tmp_path / "bad.jpg")
    facts = read_facts(path, "image")
    assert getattr(facts, empty) in (None, ())
    assert issue in facts.issues
    assert facts.width is not None  # the rest of the file still read


def _xmp_dated(stamp: str) -> bytes:
    return (f'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
            f'<rdf:Description xmlns:exif="http://ns.adobe.com/exif/1.0/" xmlns:dc="http://purl.org/dc/elements/1.1/" '
            f'exif:DateTimeOriginal="{stamp}"><dc:subject><rdf:Bag><rdf:li>harbour</rdf:li></rdf:Bag></dc:subject>'
            f'</rdf:Description></rdf:RDF></x:xmpmeta>').encode()


def _pdf_dated(path: Path, stamp: str) -> Path:
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(100, 100)
    writer.add_metadata({"/Title": "Receipt", "/CreationDate": stamp})
    with open(path, "wb") as f:
        writer.write(f)
    return path


NOON_UTC = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize("make, kind, taken, issue", [
    # offsets beyond +-18 h: the offset is emptied, the time read as UTC (as one recorded without one)
    (lambda p: make_photo(p, xmp=_xmp_dated("2024-05-01T12:00:00+23:59")), "image", NOON_UTC, "xmp date offset out of range"),
    (lambda p: make_photo(p, xmp=_xmp_dated("2024-05-01T12:00:00-25:00")), "image", NOON_UTC, "xmp date offset out of range"),
    (lambda p: make_photo(p, exif=exif_block("2024:05:01 12:00:00", "+23:59")), "image", NOON_UTC,
     "exif date offset out of range"),
    (lambda p: _pdf_dated(p.with_suffix(".pdf"), "D:20240501120000+23'59'"), "pdf", NOON_UTC, "pdf date offset out of range"),
    # dates out of range or impossible: the date is emptied
    (lambda p: make_photo(p, xmp=_xmp_dated("0001-01-01T00:00:00+18:00")), "image", None, "xmp date out of range"),
    (lambda p: make_photo(p, xmp=_xmp_dated("2024-02-30T10:00:00")), "image", None, "xmp date unreadable"),
    (lambda p: make_photo(p, exif=exif_block("2024:13:45 10:00:00")), "image", None, "exif date unreadable"),
    (lambda p: _pdf_dated(p.with_suffix(".pdf"), "D:20241345"), "pdf", None, "pdf date unreadable"),
])
def test_a_bad_date_or_offset_empties_that_field_never_the_file(tmp_path, make, kind, taken, issue):
    facts = read_facts(make(tmp_path / "bad.jpg"), kind)
    assert facts.taken == taken and facts.taken_offset_min is None and issue in facts.issues
    if kind == "image" and "xmp" in issue:
        assert facts.keywords == ("harbour",)  # the packet's other fields still read
    assert facts.width is not None or kind == "pdf"


@pytest.mark.parametrize("raw_gps, lat, issue", [
    ({1: "N", 2: (TiffImagePlugin.IFDRational(10, 1), TiffImagePlugin.IFDRational(30, 1)), 3: "E", 4: (1.0, 0.0, 0.0)},
     None, "gps out of range"),  # two values where three belong
    ({1: "N", 2: (10.0, 0.0, 0.0), 3: "E", 4: (1.0, 0.0, 0.0), 6: TiffImagePlugin.IFDRational(5, 0)}, 10.0,
     "gps altitude out of range"),  # a zero denominator costs the altitude, not the position
    ({1: "N", 2: (10.0, 0.0, 0.0), 3: "E", 4: (1.0, 0.0, 0.0), 6: TiffImagePlugin.IFDRational(10**9, 1)}, 10.0,
     "gps altitude out of range"),
])
def test_odd_gps_rationals_empty_the_position_or_the_altitude_only(tmp_path, raw_gps, lat, issue):
    facts = read_facts(make_photo(tmp_path / "g.jpg", exif=exif_block("2024:05:01 12:00:00", raw_gps=raw_gps)), "image")
    assert facts.lat == (None if lat is None else pytest.approx(lat)) and facts.alt is None and issue in facts.issues
    assert facts.taken == NOON_UTC  # the rest of the file still read


def test_a_value_no_reader_checked_empties_its_own_field_with_an_issue():
    from faste_mm.retrieval.library.photo_metadata import _Facts, _valid_facts

    facts = _Facts()
    facts.fields.update(taken=NOON_UTC, taken_offset_min=60 * 30, taken_source="xmp", rating=4, lat=1.0, lon=2.0)
    valid = _valid_facts(facts)
    assert (valid.taken, valid.rating, valid.lat) == (None, 4, 1.0) and "taken out of range" in valid.issues


def test_index_keeps_a_photo_whose_xmp_offset_is_beyond_18_hours(tmp_path, embedder):
    (tmp_path / "photos").mkdir()
    make_photo(tmp_path / "photos" / "harbour.jpg", xmp=_xmp_dated("2024-05-01T12:00:00+23:59"))
    retriever = Retriever(embedder, collection=tmp_path / "col", r_max=0.0)
    report = retriever.index([tmp_path / "photos"])
    assert (report.embedded, report.failed) == (1, 0)
    assert report.metadata_issues == {"xmp date offset out of range": 1}
    hit = retriever.search("harbour", k=1, mode="lexical")[0]
    assert hit.facts.keywords == ("harbour",) and hit.facts.taken == NOON_UTC


def test_a_pdf_gives_title_author_and_creation_date(tmp_path):
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(200, 200)
    writer.add_metadata({"/Title": "Invoice 2024-001", "/Author": "Acme GmbH",
                         "/CreationDate": "D:20240315093000+02'00'"})
    with open(tmp_path / "inv.pdf", "wb") as f:
        writer.write(f)
    facts = read_facts(tmp_path / "inv.pdf", "pdf")
    assert (facts.title, facts.author, facts.taken_source, facts.taken_offset_min) == (
        "Invoice 2024-001", "Acme GmbH", "pdf", 120)
    assert facts.taken == datetime(2024, 3, 15, 7, 30, tzinfo=timezone.utc).timestamp()


def test_a_video_gives_creation_time_and_duration(tmp_path):
    path = tmp_path / "clip.mp4"
    with av.open(str(path), "w") as out:
        out.metadata["creation_time"] = "2023-07-04T18:30:00.000000Z"
        stream = out.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for i in range(20):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), i * 10, dtype=np.uint8), format="rgb24")
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    facts = read_facts(path, "video")
    assert facts.taken == datetime(2023, 7, 4, 18, 30, tzinfo=timezone.utc).timestamp()
    assert (facts.taken_source, facts.taken_offset_min) == ("video", 0)
    assert facts.duration_s == pytest.approx(2.0, abs=0.2)


def test_an_unreadable_file_gives_an_issue_never_an_exception(tmp_path):
    (tmp_path / "x.jpg").write_bytes(b"not a jpeg")
    facts = read_facts(tmp_path / "x.jpg", "image")
    assert facts.issues == ("image metadata unreadable",) and facts.taken is None


def test_facts_refuse_impossible_values_when_built_by_hand():
    with pytest.raises(InputError, match="ItemFacts.lat"):
        ItemFacts(lat=float("nan"), lon=0.0)
    with pytest.raises(InputError, match="ItemFacts.rating"):
        ItemFacts(rating=9)


# ---- stored with the items ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    return Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu")


@pytest.fixture(scope="module")
def indexed(tmp_path_factory, embedder):
    root = tmp_path_factory.mktemp("photos")
    beach_photo(root / "beach.jpg", seed=1)
    make_photo(root / "plain.jpg", seed=2)
    make_photo(root / "laughs.jpg", seed=3, xmp=BILLION_LAUGHS.encode())
    retriever = Retriever(embedder, collection=root.parent / (root.name + "-col"), r_max=0.0)
    report = retriever.index([root])
    return retriever, root, report


def test_index_stores_the_facts_and_counts_the_issues_without_failing_a_file(indexed):
    retriever, root, report = indexed
    assert report.embedded == 3 and report.failed == 0
    assert report.metadata_issues == {"xmp refused (DTD or entities)": 1}
    assert report.to_dict()["metadata_issues"] == {"xmp refused (DTD or entities)": 1}
    hits = retriever.search("beach", k=3)
    beach = next(h for h in hits if h.uri.endswith("beach.jpg"))
    assert beach.facts.camera == "Google Pixel 8" and beach.facts.keywords[0] == "beach"
    assert beach.to_dict()["facts"]["taken"] == "2024-05-01T14:03:00+01:00"


def test_keywords_place_and_camera_match_lexically(indexed):
    retriever, _, _ = indexed
    for words in ("beach lisbon", "portugal", "pixel", "sunset"):
        hits = retriever.search(words, k=3, mode="lexical")
        assert [Path(h.uri).name for h in hits][:1] == ["beach.jpg"], words


def test_a_rescan_of_an_older_collection_fills_the_facts_without_embedding(tmp_path, embedder, monkeypatch):
    root = tmp_path / "photos"
    root.mkdir()
    beach_photo(root / "beach.jpg", seed=1)
    make_photo(root / "plain.jpg", seed=2)
    col_dir = tmp_path / "col"
    Retriever(embedder, collection=col_dir, r_max=0.0).index([root])
    with Collection.open(col_dir) as col:
        before = {r.uri: v.tobytes() for records, vectors in col.iter_live() for r, v in zip(records, vectors)}
    downgrade(col_dir, 6)  # as a collection made before the facts existed
    with Collection.open(col_dir) as reader:  # an old file stays readable: records without facts
        assert all(r.facts is None for records, _ in reader.iter_live() for r in records)

    def no_model(*args, **kwargs):
        raise AssertionError("the model was called")

    monkeypatch.setattr(Embedder, "encode", no_model)
    report = Retriever(embedder, collection=col_dir, r_max=0.0).index([root])
    assert (report.embedded, report.reused, report.unchanged, report.facts_filled) == (0, 0, 2, 2)
    with Collection.open(col_dir) as col:
        after = {r.uri: v.tobytes() for records, vectors in col.iter_live() for r, v in zip(records, vectors)}
        records = {Path(r.uri).name: r for r in col.get(sorted(col.live_ids(range(100))))}
        found = col.find(2, texts=["lisbon"], mode="lexical")
    assert after == before  # vectors byte-identical
    assert records["beach.jpg"].facts.region == "Lisbon" and records["plain.jpg"].facts.taken is None
    assert [Path(found.records[int(i)].uri).name for i in found.ids[0] if i >= 0] == ["beach.jpg"]
    again = Retriever(embedder, collection=col_dir, r_max=0.0).index([root])
    assert again.facts_filled == 0  # filled once


def test_a_row_an_older_faste_mm_dated_by_the_files_mtime_reads_back_undated():
    from faste_mm.indexers.facts import COLUMNS, from_row, to_row

    row = list(to_row(1, ItemFacts(taken=1_500_000_000.0, taken_source="exif", width=4)))[2:]
    row[COLUMNS.index("taken_source")] = "mtime"  # as written before undated files stayed undated
    facts = from_row(row)
    assert (facts.taken, facts.taken_source, facts.width) == (None, None, 4)
    from faste_mm.indexers.facts import facts_from_dict  # a hit's JSON from an older server

    sent = facts_from_dict({"taken": "2017-07-14T02:40:00Z", "taken_unix": 1_500_000_000.0, "taken_source": "mtime"})
    assert (sent.taken, sent.taken_source) == (None, None)


def test_info_counts_the_facts_and_the_cli_shows_them(indexed):
    retriever, _, _ = indexed
    facts = retriever.info().facts
    assert (facts["items"], facts["dated"], facts["with_gps"], facts["with_keywords"]) == (3, 1, 1, 1)
    assert facts["taken_first"] == facts["taken_last"] == "2024-05-01T13:03:00+00:00"
    from typer.testing import CliRunner

    from faste_mm.cli.app import app

    shown = CliRunner().invoke(app, ["info", "-c", str(retriever.collection)])
    assert shown.exit_code == 0 and "1 dated (2024-05-01 .. 2024-05-01), 1 with GPS" in " ".join(shown.stdout.split())
