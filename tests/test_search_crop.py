"""Search by a region of a picture (`crop`, issue 47): a crop of a query image, of an indexed item's
file (`like` + crop) or of a PDF page finds what embedding the pre-cropped picture finds, in
Python, on the command line (here and through a running server), over POST /search as JSON and as a
form, and through the MCP `search` tool (the official SDK's client); every bad box is refused
naming crop, with the picture's size where the box does not fit it."""

from __future__ import annotations

import base64
import json
import signal
from pathlib import Path

import pytest
from PIL import Image, ImageOps

pytest.importorskip("fastapi", reason="needs the serve extra: pip install 'faste-mm[serve]'")
pytest.importorskip("mcp", reason="needs the mcp extra: pip install 'faste-mm[mcp]'")
import httpx2  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from faste_mm import Retriever  # noqa: E402
from faste_mm.errors import ConfigError, InputError  # noqa: E402
from faste_mm.model.file_decoding import load_image  # noqa: E402
from faste_mm.model.items import Item  # noqa: E402
from faste_mm.cli.app import app  # noqa: E402
from faste_mm.retrieval.profile import read_profile  # noqa: E402
from faste_mm.retrieval.search_request import OPTIONS  # noqa: E402
from faste_mm.serving.discovery import find_server  # noqa: E402
from tests.helpers.bounds import first_line  # noqa: E402
from tests.helpers.inputs import write_video  # noqa: E402
from tests.helpers.mcp_fixtures import check_structured, error_text, http_transport, open_session  # noqa: E402
from tests.helpers.mcp_fixtures import tiny_collection  # noqa: E402
from tests.helpers.photo_fixtures import exif_block, make_photo  # noqa: E402
from tests.helpers.warm_process import start_cli  # noqa: E402

runner = CliRunner()
BOX = (12, 20, 90, 64)  # inside every 160x120 scene of the gallery
K = 5


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Scenes, a 2-page PDF, a note, a video and a photo whose EXIF turns it a quarter (stored 96x64,
    upright 64x96), indexed and served by `faste-mm serve -c`."""
    base = tmp_path_factory.mktemp("crop")
    embedder, col, gallery, _ = tiny_collection(base)
    write_video(gallery / "clip.mp4", 1.0, 4)
    make_photo(gallery / "turned.jpg", 5, size=(96, 64), exif=exif_block(orientation=6))
    Retriever(embedder, collection=col).index([gallery])
    with Retriever(embedder, collection=col) as retriever:
        ids = {(Path(h.uri).name, h.page): h.id for h in retriever.search("anything", k=50, rerank=False)}
    server = start_cli(["serve", "-c", str(col), "--port", "0", "--device", "cpu", "--threads", "1"])
    try:
        line = first_line(server, "faste-mm serve")
        assert line.startswith("serving on "), line
        yield {"embedder": embedder, "col": col, "gallery": gallery, "ids": ids, "base": base,
               "scene": sorted(gallery.glob("*.png"))[0], "url": line.split()[-1],
               "headers": {"Authorization": f"Bearer {find_server(col).token}"}}
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)


def _retriever(world) -> Retriever:
    return Retriever(world["embedder"], collection=world["col"])


def _cut(world, picture: Image.Image, box, name: str) -> Path:
    """The region `box` of `picture` saved as a lossless file: the pre-cropped query to compare with."""
    x, y, w, h = box
    path = world["base"] / name
    picture.crop((x, y, x + w, y + h)).save(path)
    return path


def _ranked(hits) -> list[tuple[int, float]]:
    return [(h["id"], h["score"]) if isinstance(h, dict) else (h.id, h.score) for h in hits]


def _same(expected, got, where: str, tolerance: float = 1e-4) -> None:
    assert [i for i, _ in got] == [i for i, _ in expected], where
    assert [s for _, s in got] == pytest.approx([s for _, s in expected], abs=tolerance), where


def _data_url(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


# ---- the region is what is searched -----------------------------------------------------------------
def test_a_crop_of_a_query_image_finds_what_the_pre_cropped_file_finds(world):
    cut = _cut(world, Image.open(world["scene"]), BOX, "scene-cut.png")
    with _retriever(world) as retriever:
        cropped = retriever.search(image=world["scene"], crop=BOX, k=K)
        expected = retriever.search(image=cut, k=K)
        whole = retriever.search(image=world["scene"], k=K)
        as_text = retriever.search(image=world["scene"], crop=",".join(map(str, BOX)), k=K)
    _same(_ranked(expected), _ranked(cropped), "crop vs the pre-cropped file")
    _same(_ranked(expected), _ranked(as_text), "crop as 'X,Y,W,H'")
    assert _ranked(whole) != _ranked(cropped)  # the region, not the whole picture, was searched


def test_more_like_with_a_crop_embeds_the_region_of_the_items_file_and_leaves_the_item_out(world):
    item = world["ids"][(world["scene"].name, None)]
    cut = _cut(world, Image.open(world["scene"]), BOX, "like-cut.png")
    with _retriever(world) as retriever:
        region = retriever.more_like(item, crop=BOX, k=K)
        by_path = retriever.more_like(str(world["scene"]), crop=BOX, k=K)
        expected = [h for h in retriever.search(image=cut, k=K + 1) if h.id != item][:K]
        stored = retriever.more_like(item, k=K)
        whole = retriever.more_like(item, crop=(0, 0, 160, 120), k=K)
    _same(_ranked(expected), _ranked(region), "like + crop vs the pre-cropped file")
    _same(_ranked(region), _ranked(by_path), "like a path + crop")
    assert item not in [h.id for h in region]
    # the whole picture embedded again is the stored vector (up to float32 batching): like alone searches with that
    _same(_ranked(stored), _ranked(whole), "the whole picture as a crop vs the stored vector", tolerance=1e-3)


def test_a_crop_of_a_pdf_page_cuts_the_page_as_rendered_for_the_model(world):
    page = world["ids"][("report.pdf", 2)]
    max_pixels = read_profile(world["col"]).max_pixels
    rendered = load_image(Item(image=world["gallery"] / "report.pdf", page=2), max_pixels)
    box = (rendered.width // 4, rendered.height // 3, rendered.width // 2, rendered.height // 3)
    cut = _cut(world, rendered, box, "page-cut.png")
    first = _cut(world, load_image(Item(image=world["gallery"] / "report.pdf", page=1), max_pixels), box, "first.png")
    with _retriever(world) as retriever:
        region = retriever.more_like(page, crop=box, k=K)
        expected = [h for h in retriever.search(image=cut, k=K + 1) if h.id != page][:K]
        of_file = retriever.search(image=world["gallery"] / "report.pdf", crop=box, k=K)  # a PDF file: page 1
        first_page = retriever.search(image=first, k=K)
    _same(_ranked(expected), _ranked(region), "a PDF page's region")
    _same(_ranked(first_page), _ranked(of_file), "a PDF file's first page")


def test_a_crop_of_a_turned_photo_is_given_upright_as_viewers_show_it(world):
    photo = world["gallery"] / "turned.jpg"
    upright = ImageOps.exif_transpose(Image.open(photo))
    assert upright.size == (64, 96)  # stored 96x64, turned a quarter by its EXIF orientation
    box = (8, 50, 40, 40)  # inside the upright picture only (y + h = 90 > 64)
    cut = _cut(world, upright, box, "turned-cut.png")
    with _retriever(world) as retriever:
        _same(_ranked(retriever.search(image=cut, k=K)), _ranked(retriever.search(image=photo, crop=box, k=K)),
              "the upright region")


def test_a_tiny_region_is_upscaled_into_the_models_pixel_budget_as_any_small_image(world):
    cut = _cut(world, Image.open(world["scene"]), (30, 30, 3, 2), "tiny.png")
    with _retriever(world) as retriever:
        _same(_ranked(retriever.search(image=cut, k=K)),
              _ranked(retriever.search(image=world["scene"], crop=(30, 30, 3, 2), k=K)), "a 3x2 region")


# ---- bad boxes --------------------------------------------------------------------------------------
@pytest.mark.parametrize("crop, words", [
    ("1,2,3", "must be X,Y,W,H"), ("a,b,c,d", "must be X,Y,W,H"), ("1,2,3,4,5", "must be X,Y,W,H"),
    ((1.5, 2, 3, 4), "must be X,Y,W,H"), ((True, 2, 3, 4), "must be X,Y,W,H"), (7, "must be X,Y,W,H"),
    ("--5,1,1,1", "must be X,Y,W,H"), ("0,0,0,5", "no area"), ((0, 0, 5, -2), "no area"),
    ("-1,0,5,5", "left of or above"),
])
def test_a_malformed_box_is_refused_naming_crop_before_anything_is_read(world, crop, words):
    with _retriever(world) as retriever, pytest.raises(ConfigError, match="crop") as error:
        retriever.search(image=world["scene"], crop=crop)
    assert words in str(error.value)


@pytest.mark.parametrize("crop, words", [
    ((100, 100, 100, 10), "reaches past the picture's edge"), ((0, 110, 10, 20), "reaches past"),
    ((0, 0, 161, 10), "larger than the picture"), ((0, 0, 500, 500), "larger than the picture"),
    ((160, 0, 1, 1), "reaches past"),
])
def test_a_box_outside_the_picture_is_refused_with_the_pictures_size(world, crop, words):
    with _retriever(world) as retriever, pytest.raises(InputError, match="crop") as error:
        retriever.search(image=world["scene"], crop=crop)
    message = str(error.value)
    assert words in message and "160x120 pixels" in message and world["scene"].name in message


def test_a_turned_photos_bounds_are_its_upright_size(world):
    with _retriever(world) as retriever, pytest.raises(InputError, match="64x96 pixels .upright") as error:
        retriever.search(image=world["gallery"] / "turned.jpg", crop=(0, 0, 90, 10))
    assert "larger than the picture" in str(error.value)


def test_a_crop_of_a_video_or_a_note_or_without_a_picture_is_refused(world):
    with _retriever(world) as retriever:
        for name in ("clip.mp4", "picnic.txt"):
            with pytest.raises(InputError, match="crop cuts a region of an image or a PDF page") as error:
                retriever.more_like(world["ids"][(name, None)], crop=(0, 0, 4, 4))
            assert name in str(error.value)
        with pytest.raises(InputError, match="video query cannot be cropped"):
            retriever.search(video=world["gallery"] / "clip.mp4", crop=(0, 0, 4, 4))
        with pytest.raises(InputError, match="`crop` cuts a region of a picture"):
            retriever.search("a sunset", crop=(0, 0, 4, 4))


# ---- every front end passes it through --------------------------------------------------------------
def _cli(world, *args: str):
    return runner.invoke(app, ["search", "-c", str(world["col"]), "--device", "cpu", "-k", str(K), "--format", "json",
                               *args])


def test_the_command_line_searches_a_region_here_and_through_the_server(world):
    item = world["ids"][(world["scene"].name, None)]
    with _retriever(world) as retriever:
        by_image = _ranked(retriever.search(image=world["scene"], crop=BOX, k=K))
        by_like = _ranked(retriever.more_like(item, crop=BOX, k=K))
    crop = ",".join(map(str, BOX))
    here = _cli(world, "--image", str(world["scene"]), "--crop", crop, "--no-server")
    assert here.exit_code == 0, here.output
    answer = json.loads(here.stdout)
    assert answer["query"]["crop"] == list(BOX)
    _same(by_image, _ranked(answer["hits"]), "cli --image --crop")
    served = _cli(world, "--like", str(item), "--crop", crop, "--debug")
    assert served.exit_code == 0, served.output
    assert "through the server" in served.stderr, served.stderr  # the thin client sends like + crop
    _same(by_like, _ranked(json.loads(served.stdout)["hits"]), "thin client --like --crop")


def test_the_command_line_names_the_crop_flag_in_its_errors(world):
    malformed = _cli(world, "--image", str(world["scene"]), "--crop", "1,2,3", "--no-server")
    assert malformed.exit_code == 2 and "--crop must be X,Y,W,H" in malformed.stderr, malformed.output
    alone = _cli(world, "a sunset", "--crop", "1,2,3,4", "--no-server")
    assert alone.exit_code == 2 and "--crop cuts a region" in alone.stderr and "--image" in alone.stderr, alone.output
    outside = _cli(world, "--image", str(world["scene"]), "--crop", "0,0,10,500", "--no-server")
    assert outside.exit_code == 1 and "crop 0,0,10,500" in outside.stderr and "160x120" in outside.stderr


def _post(world, json_body=None, form=None, files=None):
    return httpx2.post(world["url"] + "search", json=json_body, data=form, files=files, headers=world["headers"],
                       timeout=300)


def test_post_search_takes_crop_as_json_and_as_a_form(world):
    item = world["ids"][(world["scene"].name, None)]
    with _retriever(world) as retriever:
        by_image = _ranked(retriever.search(image=world["scene"], crop=BOX, k=K))
        by_like = _ranked(retriever.more_like(item, crop=BOX, k=K))
        turned = _ranked(retriever.search(image=world["gallery"] / "turned.jpg", crop=(8, 50, 40, 40), k=K))
    text = ",".join(map(str, BOX))
    answers = {
        "json image": (_post(world, {"image": _data_url(world["scene"]), "crop": list(BOX), "k": K}), by_image),
        "json like": (_post(world, {"like": item, "crop": text, "k": K}), by_like),
        "form image": (_post(world, form={"crop": text, "k": str(K)},
                             files={"image": ("scene.png", world["scene"].read_bytes(), "image/png")}), by_image),
        "form id": (_post(world, form={"id": str(item), "crop": text, "k": str(K)}), by_like),
        # an uploaded photo keeps its EXIF: its region is given upright, as the page shows it
        "json turned": (_post(world, {"image": "data:image/jpeg;base64," + base64.b64encode(
            (world["gallery"] / "turned.jpg").read_bytes()).decode(), "crop": [8, 50, 40, 40], "k": K}), turned),
    }
    for where, (answer, expected) in answers.items():
        assert answer.status_code == 200, (where, answer.text)
        _same(expected, _ranked(answer.json()["hits"]), where)
    assert answers["json like"][0].json()["query"]["crop"] == list(BOX)


def test_post_search_refuses_a_bad_crop_with_400_naming_it(world):
    video = world["ids"][("clip.mp4", None)]
    item = world["ids"][(world["scene"].name, None)]
    for body, words in (({"like": item, "crop": "1,2"}, "crop must be X,Y,W,H"),
                        ({"like": item, "crop": [0, 0, 161, 1]}, "160x120 pixels"),
                        ({"like": video, "crop": [0, 0, 4, 4]}, "a video item"),
                        ({"query": "a sunset", "crop": [0, 0, 4, 4]}, "`crop` cuts a region")):
        answer = _post(world, body)
        assert answer.status_code == 400 and words in answer.text, (body, answer.text)
    form = _post(world, form={"id": str(item), "crop": "0,0,-3,4"})
    assert form.status_code == 400 and "no area" in form.text, form.text


def test_the_page_preview_says_the_size_a_region_is_given_in(world):
    ids = world["ids"]
    sizes = {}
    for key in ((world["scene"].name, None), ("turned.jpg", None), ("report.pdf", 2), ("clip.mp4", None)):
        answer = httpx2.get(f"{world['url']}previews/{ids[key]}", headers=world["headers"], timeout=120)
        assert answer.status_code == 200, answer.text
        sizes[key[0]] = answer.headers.get("x-picture-size")
    rendered = load_image(Item(image=world["gallery"] / "report.pdf", page=2), read_profile(world["col"]).max_pixels)
    assert sizes == {world["scene"].name: "160x120", "turned.jpg": "64x96",
                     "report.pdf": "{}x{}".format(*rendered.size), "clip.mp4": None}


def test_the_mcp_search_tool_takes_crop(world):
    item = world["ids"][(world["scene"].name, None)]
    with _retriever(world) as retriever:
        by_like = _ranked(retriever.more_like(item, crop=BOX, k=K))
        by_image = _ranked(retriever.search(image=world["scene"], crop=BOX, k=K))
    with open_session(http_transport(world["url"] + "mcp", world["headers"], timeout=300)) as session:
        tools = {tool.name: tool for tool in session.list_tools().tools}
        assert "crop" in tools["search"].input_schema["properties"]
        like = check_structured(tools, "search", session.call("search", {"like": item, "crop": list(BOX), "k": K,
                                                                          "thumbnails": False}))
        image = check_structured(tools, "search", session.call("search", {
            "image": str(world["scene"]), "crop": ",".join(map(str, BOX)), "k": K, "thumbnails": False}))
        refused = error_text(session.call("search", {"like": item, "crop": [0, 0, 999, 4], "thumbnails": False}))
    _same(by_like, _ranked(like["hits"]), "mcp like + crop")
    _same(by_image, _ranked(image["hits"]), "mcp image + crop")
    assert "crop 0,0,999,4" in refused and "160x120" in refused


def test_a_box_is_read_from_text_a_list_or_numpy_integers():
    import numpy as np

    from faste_mm.retrieval.search_request import SearchRequest

    for given in (" 1, 2 ,3,4", [1, 2, 3, 4], tuple(np.arange(1, 5)), np.arange(1, 5).tolist()):
        assert SearchRequest.of("test", image="a.png", crop=given).crop == (1, 2, 3, 4)
    assert SearchRequest.of("test", like=7, crop="1,2,3,4").wire()["crop"] == [1, 2, 3, 4]  # the thin client's body


def test_crop_is_one_declared_option_every_front_end_but_the_text_adapters_shows():
    declared = OPTIONS["crop"]
    assert declared.flag == "--crop" and declared.kind == "box"
    assert set(declared.fronts) == {"python", "cli", "http", "form", "mcp", "client"}
