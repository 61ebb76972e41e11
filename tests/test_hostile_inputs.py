"""The hostile-input suite: one `faste-mm index` run over a folder of malformed, odd and unsafe
inputs (generated here). The run completes, every good file is indexed, and every bad one is a
failure naming the file and saying what to do; names are shown safely by search and info."""

from __future__ import annotations

import io
import json
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from faste_mm.cli.app import app
from faste_mm.indexers import Collection
from faste_mm.retrieval.decoders import TEXT_READ_BYTES, read_text_file

from tests.helpers.inputs import noise_image, tiny_vl_dir

runner = CliRunner()
IS_ROOT = os.geteuid() == 0

# name -> the failure message must contain this (None: the file must be indexed; "either": an
# odd but legal file that may be indexed or refused, as long as a refusal names it).
CASES: dict[str, str | None] = {
    "good.png": None,
    "cmyk.jpg": None,
    "rgb16.png": "either",
    "la.png": None,
    "palette.png": None,
    "int32.tif": "either",
    "float.tif": "either",
    "multipage.tif": None,
    "animated.gif": None,
    "one_pixel.png": None,
    "needle_1x60000.png": "cannot resize the image",
    "bomb_header.png": "downscale it first",
    "bomb_real.png": "downscale it first",
    "huge.jpg": None,  # decoded at a reduced JPEG scale
    "page_200000pt.pdf": "either",
    "page_1pt.pdf": None,
    "encrypted_user.pdf": "encrypted; decrypt it",
    "encrypted_owner.pdf": None,  # opens without a password
    "zero_pages.pdf": "has no pages",
    "bad_second_page.pdf": "either",
    "truncated.jpg": "re-export the file",
    "truncated.png": "re-export the file",
    "truncated.pdf": "repair or re-export it",
    "png_named.jpg": None,
    "text_named.png": "fix or remove the file",
    "random.png": "fix or remove the file",
    "bad_crc.png": "re-export the file",
    "zero_bytes.png": "empty (0 bytes); remove it or re-export it",
    "latin1.txt": "not UTF-8 text",
    "empty.txt": "empty (no text); remove it or add text",
    "whitespace.txt": "empty (no text); remove it or add text",
    "bom.txt": None,
    "ten_mb.txt": None,
    "loop_a.png": "symbolic link loop",
    "loop_b.png": "symbolic link loop",
    "dangling.png": "broken symbolic link",
    "fifo.png": "FIFO",
    "x.jpg/inner.png": None,  # a folder named like an image is walked
    "unreadable.png": "check that it exists and that you may read it",
    "new\nline.png": None,
    "ansi\x1b[31mred.png": None,
    "[red]markup.png": None,
    "Invoice [final].jpg": None,
    "a[/i]b.png": None,
    "x[link=file:evil]y.png": None,
    os.fsdecode(b"latin1-\xff\xfe.png"): None,
    "n" * 246 + ".png": None,
}


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _pdf(path: Path, sizes, *, password: str | None = None, owner_only: bool = False) -> None:
    from pypdf import PdfWriter

    writer = PdfWriter()
    for width, height in sizes:
        writer.add_blank_page(width=width, height=height)
    if password is not None:
        writer.encrypt(user_password="" if owner_only else password, owner_password=password, algorithm="AES-128")
    with open(path, "wb") as f:
        writer.write(f)


def build_corpus(root: Path) -> None:
    root.mkdir()
    noise_image(root / "good.png", (64, 48), 1)
    Image.fromarray(np.random.default_rng(2).integers(0, 256, (40, 40, 4), dtype=np.uint8), "CMYK").save(root / "cmyk.jpg")
    Image.fromarray(np.random.default_rng(3).integers(0, 65535, (40, 40), dtype=np.uint16)).save(root / "rgb16.png")
    Image.new("LA", (40, 40), (100, 200)).save(root / "la.png")
    Image.fromarray(np.random.default_rng(4).integers(0, 256, (40, 40, 3), dtype=np.uint8)).convert("P").save(root / "palette.png")
    Image.fromarray(np.random.default_rng(5).integers(-2**20, 2**20, (40, 40), dtype=np.int32), "I").save(root / "int32.tif")
    Image.fromarray(np.random.default_rng(6).random((40, 40), dtype=np.float32), "F").save(root / "float.tif")
    frames = [Image.new("RGB", (40, 40), c) for c in ((255, 0, 0), (0, 255, 0))]
    frames[0].save(root / "multipage.tif", save_all=True, append_images=frames[1:])
    frames[0].save(root / "animated.gif", save_all=True, append_images=frames[1:], duration=100, loop=0)
    Image.new("RGB", (1, 1), (9, 9, 9)).save(root / "one_pixel.png")
    Image.new("L", (1, 60000), 7).save(root / "needle_1x60000.png")
    # A header claiming 100000 x 100000 pixels and no image data: refused from the header alone.
    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 0, 0, 0, 0)
    (root / "bomb_header.png").write_bytes(b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr)
                                           + _png_chunk(b"IDAT", zlib.compress(b"\0" * 100)) + _png_chunk(b"IEND", b""))
    Image.new("L", (9500, 9500), 0).save(root / "bomb_real.png")  # past Pillow's warning limit
    Image.new("L", (8300, 8300), 90).save(root / "huge.jpg", quality=50)
    _pdf(root / "page_200000pt.pdf", [(200_000, 200_000)])
    _pdf(root / "page_1pt.pdf", [(1, 1)])
    _pdf(root / "encrypted_user.pdf", [(200, 200)], password="secret")
    _pdf(root / "encrypted_owner.pdf", [(200, 200)], password="secret", owner_only=True)
    import pypdfium2 as pdfium

    empty = pdfium.PdfDocument.new()  # a valid PDF whose page tree has no pages
    empty.save(str(root / "zero_pages.pdf"))
    empty.close()
    _pdf(root / "bad_second_page.pdf", [(200, 200), (200, 200)])
    data = (root / "bad_second_page.pdf").read_bytes()
    (root / "bad_second_page.pdf").write_bytes(data.replace(b"/MediaBox", b"/MediaBax", 2)[::1])
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(7).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buffer, "JPEG")
    (root / "truncated.jpg").write_bytes(buffer.getvalue()[:300])
    (root / "truncated.png").write_bytes((root / "good.png").read_bytes()[:200])
    (root / "truncated.pdf").write_bytes((root / "page_1pt.pdf").read_bytes()[:60])
    (root / "png_named.jpg").write_bytes((root / "good.png").read_bytes())
    (root / "text_named.png").write_text("just words, not pixels")
    (root / "random.png").write_bytes(np.random.default_rng(8).bytes(4096))
    png = bytearray((root / "good.png").read_bytes())
    idat = png.index(b"IDAT")
    png[idat + 40] ^= 0xFF  # inside the compressed data: the CRC no longer matches
    (root / "bad_crc.png").write_bytes(bytes(png))
    (root / "zero_bytes.png").write_bytes(b"")
    (root / "latin1.txt").write_bytes("café crème brûlée".encode("latin-1"))
    (root / "empty.txt").write_bytes(b"")
    (root / "whitespace.txt").write_text(" \n\t \n")
    (root / "bom.txt").write_bytes("\ufeffa text with a byte order mark".encode("utf-8"))
    (root / "ten_mb.txt").write_text("lorem ipsum dolor sit amet " * (10 * 2**20 // 27))
    os.symlink("loop_b.png", root / "loop_a.png")
    os.symlink("loop_a.png", root / "loop_b.png")
    os.symlink("no_such_target.png", root / "dangling.png")
    os.mkfifo(root / "fifo.png")
    (root / "x.jpg").mkdir()
    noise_image(root / "x.jpg" / "inner.png", (40, 40), 9)
    noise_image(root / "unreadable.png", (40, 40), 10)
    os.chmod(root / "unreadable.png", 0)
    for seed, name in enumerate(["new\nline.png", "ansi\x1b[31mred.png", "[red]markup.png", "Invoice [final].jpg",
                                 "x[link=file:evil]y.png", "n" * 246 + ".png"], start=20):
        noise_image(root / name, (40, 40), seed)
    (root / "a[").mkdir()
    noise_image(root / "a[" / "i]b.png", (40, 40), 30)
    noise_image(root / os.fsdecode(b"latin1-\xff\xfe.png"), (40, 40), 31)


def _path(root: Path, name: str) -> Path:
    return root / ("a[/i]b.png" if name == "a[/i]b.png" else name)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    model = tiny_vl_dir(tmp_path_factory.getbasetemp())
    root, col = base / "corpus", base / "col"
    build_corpus(root)
    result = runner.invoke(app, ["index", str(root), "-c", str(col), "--model", str(model), "--device", "cpu",
                                 "--format", "json"])
    return root, col, result


def test_the_run_completes_without_tracebacks_or_raw_third_party_warnings(indexed):
    _, _, result = indexed
    assert result.exit_code == 0, (result.stderr[-3000:], result.exception)
    for leak in ("Traceback", "DecompressionBombWarning", "Token indices sequence length"):
        assert leak not in result.stderr


@pytest.mark.parametrize("name", sorted(CASES), ids=lambda n: repr(n)[1:-1][:40])
def test_each_input_is_indexed_or_a_failure_naming_the_file(indexed, name):
    root, col, result = indexed
    expected = CASES[name]
    if name == "unreadable.png" and IS_ROOT:
        pytest.skip("root reads files whatever their permissions")
    report = json.loads(result.stdout)
    uri = os.path.abspath(_path(root, name))
    failures = {f["uri"]: f["error"] for f in report["failures"]}
    with Collection.open(col) as c:
        live = set(c.read(lambda rows: rows.live_uris())) - set(failures)
    if expected is None:
        assert uri in live, failures.get(uri)
    elif expected == "either":
        assert uri in live or str(_path(root, name)) in failures[uri]
    else:
        assert uri in failures, f"{name} was indexed"
        assert str(_path(root, name)) in failures[uri] and expected in failures[uri], failures[uri]


def test_the_other_files_are_all_indexed_once(indexed):
    root, col, result = indexed
    with Collection.open(col) as c:
        info = c.info()
    report = json.loads(result.stdout)
    must = sum(1 for name, want in CASES.items() if want is None and not (name == "unreadable.png" and IS_ROOT))
    assert info.n_ok >= must and info.n_failed == report["failed"]


def test_names_are_shown_literally_by_info_and_search(indexed):
    _, col, _ = indexed
    wide = {"COLUMNS": "2000"}  # an explicit width: long names stay on one line
    info = runner.invoke(app, ["info", "-c", str(col)], env=wide)
    assert info.exit_code == 0, info.stderr
    assert "zero_bytes.png" in info.stdout
    search = runner.invoke(app, ["search", "x", "-c", str(col), "-k", "100"], env=wide)
    assert search.exit_code == 0, (search.stderr, search.exception)
    for shown in ("Invoice [final].jpg", "a[/i]b.png", "[red]markup.png", "x[link=file:evil]y.png",
                  "latin1-\\xff\\xfe.png", "new\\nline.png", "ansi\\x1b[31mred.png"):
        assert shown in search.stdout
    assert "\x1b[31m" not in search.stdout
    paths = runner.invoke(app, ["search", "x", "-c", str(col), "-k", "100", "--format", "paths"])
    assert b"/latin1-\xff\xfe.png\n" in paths.stdout_bytes  # the very bytes of the name
    hits = json.loads(runner.invoke(app, ["search", "x", "-c", str(col), "-k", "100", "--format", "json"]).stdout)["hits"]
    assert any(os.fsencode(h["uri"]).endswith(b"/latin1-\xff\xfe.png") for h in hits)  # JSON is lossless too


def test_text_is_read_only_up_to_what_the_model_can_use(indexed):
    root, _, _ = indexed
    assert len(read_text_file(root / "ten_mb.txt").encode()) <= TEXT_READ_BYTES < (root / "ten_mb.txt").stat().st_size


def test_pillows_bomb_warning_never_reaches_the_user(indexed):
    # In a fresh interpreter with warnings shown (pytest records warnings itself, hiding them).
    import subprocess
    import sys

    root, _, _ = indexed
    probe = ("import sys; from pathlib import Path; from faste_mm.model.items import Item\n"
             "from faste_mm.model.file_decoding import load_image\n"
             "try:\n    load_image(Item(image=Path(sys.argv[1])), 1_000_000)\n"
             "except Exception as e:\n    print(type(e).__name__, e)")
    out = subprocess.run([sys.executable, "-W", "default", "-c", probe, str(root / "bomb_real.png")],
                         capture_output=True, text=True, timeout=120)
    assert "InputError" in out.stdout and "downscale it first" in out.stdout
    assert "DecompressionBombWarning" not in out.stderr, out.stderr


def _in_thread(call):
    """Run `call` in a thread; (finished, result or exception). A hang shows as unfinished."""
    import threading

    out: list = []
    thread = threading.Thread(target=lambda: out.append(_outcome(call)), daemon=True)
    thread.start()
    thread.join(60)  # a guard against hanging the suite, not a speed check
    return bool(out), (out[0] if out else None)


def _outcome(call):
    try:
        return call()
    except Exception as error:  # noqa: BLE001 - the test inspects it
        return error


def test_a_file_swapped_for_a_fifo_after_the_scan_is_refused_not_waited_on(tmp_path):
    from faste_mm.errors import InputError
    from faste_mm.indexers import content_hash

    fifo = tmp_path / "notes.txt"
    os.mkfifo(fifo)  # no writer ever opens it: a blocking open() would wait forever
    for call in (lambda: content_hash(fifo), lambda: read_text_file(fifo)):
        finished, error = _in_thread(call)
        assert finished, "blocked on the FIFO"
        assert isinstance(error, InputError) and str(fifo) in str(error) and "FIFO" in str(error), error


def test_huge_files_are_hashed_by_size_mtime_and_their_edges_and_small_ones_whole(tmp_path):
    import hashlib

    from faste_mm.indexers import content_hash

    small = tmp_path / "small.bin"
    small.write_bytes(os.urandom(5000))
    assert content_hash(small) == hashlib.sha256(small.read_bytes()).hexdigest()  # stored hashes stay valid
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    for path, middle in ((a, b"one"), (b, b"two")):
        with open(path, "wb") as f:  # sparse: 100 MiB on paper, a few bytes on disk
            f.truncate(100 << 20)
            f.seek(50 << 20)
            f.write(middle)
        os.utime(path, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    assert content_hash(a) == content_hash(b) and content_hash(a).startswith("edges:")  # the middle is not read
    os.utime(b, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_001))
    assert content_hash(a) != content_hash(b)
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as f:
        f.truncate(64 << 30)  # 64 GiB of holes: hashing it whole would read them all
    finished, digest = _in_thread(lambda: content_hash(huge))
    assert finished and isinstance(digest, str) and digest.startswith("edges:")


def _store_scan(col_root: Path, folder: Path, follow_links: bool = False):
    """Plan a scan of `folder` against a model-free collection and store what it would add
    (random unit vectors stand in for embeddings): the bookkeeping `index` does."""
    from faste_mm.indexers import ItemRecord, Manifest
    from faste_mm.retrieval.ingest import IngestTally, ingest_work, record_missing
    from faste_mm.retrieval.scanning import ScanFilter, scan_paths

    with Collection.create(col_root, Manifest(model_id="m", dim=4), exist_ok=True) as col:
        scan = scan_paths([folder], ScanFilter(follow_links=follow_links))
        plan = ingest_work(col, scan)
        col.delete(uris=plan.vanished)  # as Retriever.index does
        record_missing(col, scan.missing, IngestTally())
        if plan.todo:
            v = np.random.default_rng(0).standard_normal((len(plan.todo), 4)).astype(np.float32)
            col.add(v / np.linalg.norm(v, axis=1, keepdims=True),
                    [ItemRecord(uri=f.uri, modality=f.modality, size=f.stat.size, mtime=f.stat.mtime) for f in plan.todo])
        return scan, plan, sorted(col.read(lambda rows: rows.live_uris()))


def test_items_of_a_followed_link_to_a_file_outside_the_folder_vanish_with_the_link(tmp_path):
    folder, outside = tmp_path / "photos", tmp_path / "elsewhere"
    folder.mkdir(), outside.mkdir()
    noise_image(outside / "secret.png", (16, 16), 1)
    noise_image(folder / "own.png", (16, 16), 2)
    (folder / "link.png").symlink_to(outside / "secret.png")
    (folder / "inner.png").symlink_to(folder / "own.png")  # a link inside the folder: its target's item
    _, _, live = _store_scan(tmp_path / "col", folder, follow_links=True)
    assert live == sorted([str(folder / "own.png"), str(folder / "link.png")])
    (folder / "link.png").unlink()
    _, plan, live = _store_scan(tmp_path / "col", folder, follow_links=True)
    assert plan.vanished == (str(folder / "link.png"),) and live == [str(folder / "own.png")]
    assert (outside / "secret.png").exists()


def test_a_link_leading_outside_the_walked_folders_is_skipped_counted_and_its_old_items_removed(tmp_path):
    from faste_mm.retrieval.scanning import scan_paths

    folder, other, outside = tmp_path / "photos", tmp_path / "notes", tmp_path / "elsewhere"
    folder.mkdir(), other.mkdir(), outside.mkdir()
    noise_image(outside / "secret.png", (16, 16), 1)
    noise_image(folder / "own.png", (16, 16), 2)
    (other / "note.txt").write_text("a note")
    (folder / "link.png").symlink_to(outside / "secret.png")
    (folder / "chain.png").symlink_to(folder / "link.png")  # a link to a link that leads outside
    (folder / "inner.png").symlink_to(folder / "own.png")  # inside the folder: its target's item
    (folder / "across.txt").symlink_to(other / "note.txt")  # into another folder of the same scan
    scan = scan_paths([folder, other])
    assert {f.uri for f in scan.files()} == {str(folder / "own.png"), str(folder / "across.txt"), str(other / "note.txt")}
    assert scan.outside_links == (str(folder / "chain.png"), str(folder / "link.png"))
    assert not scan.missing
    alone = scan_paths([folder])  # the note's folder not indexed this time: its link leads outside too
    assert str(folder / "across.txt") in alone.outside_links
    # a collection that once followed the link (an older faste-mm) drops its items at the next scan
    _store_scan(tmp_path / "col", folder, follow_links=True)
    _, plan, live = _store_scan(tmp_path / "col", folder)
    assert str(folder / "link.png") in plan.vanished and str(folder / "link.png") not in live
    assert all(not uri.startswith(str(outside)) for uri in live)


def test_links_into_proc_sys_or_dev_are_never_read(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "env.txt").symlink_to("/proc/self/environ")  # the process's own API keys and tokens
    (folder / "cpu.txt").symlink_to("/sys/devices/system/cpu/online")
    (folder / "fine.txt").write_text("hello")
    scan, _, live = _store_scan(tmp_path / "col", folder)
    assert [f.uri for f in scan.files()] == [str(folder / "fine.txt")]
    reasons = dict(scan.missing)
    assert "never reads /proc, /sys or /dev" in reasons[str(folder / "env.txt")]
    assert str(folder / "cpu.txt") in reasons
    from faste_mm.retrieval.scanning import scan_paths

    named = scan_paths([folder / "env.txt"])  # named on the command line: refused the same way
    assert not named.files() and "system file" in named.missing[0][1]


def test_fifos_and_loops_are_recorded_once_not_counted_removed_on_every_run(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    os.mkfifo(folder / "pipe.txt")
    (folder / "loop.png").symlink_to(folder / "loop.png")
    (folder / "ok.txt").write_text("hi")
    first = _store_scan(tmp_path / "col", folder)
    again = _store_scan(tmp_path / "col", folder)
    assert len(first[0].missing) == 2 and again[1].vanished == ()


def test_a_right_to_left_override_in_a_name_is_printed_escaped(tmp_path):
    from faste_mm.indexers import ItemRecord, Manifest

    disguised = str(tmp_path / "invoice\u202egpj.exe")  # shows as "invoiceexe.jpg" if printed raw
    with Collection.create(tmp_path / "col", Manifest(model_id="m", dim=4)) as col:
        col.add_failures([ItemRecord(uri=disguised, modality="image", error=f"{disguised}: unsupported file type")])
    result = runner.invoke(app, ["info", "-c", str(tmp_path / "col")], env={"COLUMNS": "2000"})
    assert result.exit_code == 0, result.stderr
    assert "invoice\\u202egpj.exe" in result.stdout and "\u202e" not in result.stdout


# ---- nothing lost (helper ux): every file the walk selects is accounted for exactly once -----
def test_every_file_of_the_hostile_folder_is_stored_or_named_as_a_failure_exactly_once(indexed):
    """The run's books balance: each file the walk selects is live (once per item) or a failure
    row naming it, never both and never neither; nothing outside the folder is stored."""
    from faste_mm.retrieval.scanning import scan_paths

    root, col, result = indexed
    report = json.loads(result.stdout)
    selected = {f.uri for f in scan_paths([root]).files()}
    failed = {f["uri"] for f in report["failures"]}
    with Collection.open(col) as c:
        ids = sorted(c.live_ids(range(100_000)))
        records = c.get(ids)
    live_keys = [(r.uri, r.page) for r in records]
    assert len(live_keys) == len(set(live_keys)), "an item was stored twice"
    live = {uri for uri, _ in live_keys}
    assert not live & failed, f"stored and failed: {sorted(live & failed)}"
    assert selected <= live | failed, f"lost: {sorted(selected - live - failed)}"
    # the rest are the walk's entries that are not regular files (links to nowhere, FIFOs): failures
    others = (live | failed) - selected
    assert others <= failed and all(os.path.dirname(uri) == os.path.abspath(root) for uri in others), others
    for uri in failed:  # each failure names its file, literally
        assert any(uri in f["error"] or os.path.basename(uri) in f["error"] for f in report["failures"]
                   if f["uri"] == uri)
