"""Videos in collections, through the real CLI: a folder with videos, images, text and a broken
video is indexed one item per video file; text and video queries find them; the manifest records
the video settings and a request with other ones is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from faste_mm.indexers.manifest import Manifest
from faste_mm.retrieval.profile import CollectionProfile
from faste_mm.model.video import VideoConfig

from tests.helpers.cli import invoke
from tests.helpers.inputs import write_audio, write_video

pytest.importorskip("av")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("media")
    write_video(root / "street.mp4", 3, 4)
    (root / "clips").mkdir()
    write_video(root / "clips" / "beach.webm", 2, 5, codec="libvpx")
    write_video(root / "clips" / "wide.mov", 2, 4, size=(96, 40))
    write_audio(root / "clips" / "voice.mkv")  # a video suffix, but only audio inside
    Image.new("RGB", (80, 60), (10, 120, 200)).save(root / "sky.png")
    (root / "note.txt").write_text("a note about a beach at sunset")
    return root


def test_index_a_folder_with_videos_and_query_by_text_and_by_video(model_dirs, folder, tmp_path):
    col = tmp_path / "col"
    report = json.loads(invoke("index", folder, "-c", col, "--model", model_dirs["qwen3_vl"], "--device", "cpu",
                               "--format", "json").stdout)
    assert report["embedded"] == 5 and report["failed"] == 1  # 3 videos, an image, a text; the audio file
    (failure,) = report["failures"]
    assert failure["uri"].endswith("voice.mkv") and "no video stream" in failure["error"]

    hits = json.loads(invoke("search", "waves on a beach", "-c", col, "-k", "10", "--format", "json").stdout)["hits"]
    found = {Path(h["uri"]).name for h in hits}
    assert {"street.mp4", "beach.webm", "wide.mov"} <= found  # a text query ranks the videos too
    by_video = invoke("search", "--video", folder / "clips" / "beach.webm", "-c", col, "-k", "1", "--format", "json")
    (top,) = json.loads(by_video.stdout)["hits"]
    assert Path(top["uri"]).name == "beach.webm" and top["score"] == pytest.approx(1.0, abs=1e-3)

    only_videos = json.loads(invoke("search", "a beach", "-c", col, "--type", "video", "--format", "json").stdout)["hits"]
    assert sorted(Path(h["uri"]).name for h in only_videos) == ["beach.webm", "street.mp4", "wide.mov"]

    settings = json.loads(invoke("info", "-c", col, "--format", "json").stdout)["settings"]
    assert settings["serializer"]["video"] == VideoConfig().to_dict()
    assert "1 fps, at most 64 frames" in invoke("info", "-c", col).stdout

    again = json.loads(invoke("index", folder, "-c", col, "--format", "json").stdout)  # the collection's settings
    assert again["embedded"] == 0
    refused = invoke("index", folder, "-c", col, "--video-fps", "2", code=1)
    assert "video" in refused.stderr and "--reindex" in refused.stderr


def test_a_collection_written_before_videos_reads_as_the_video_config_defaults():
    old = CollectionProfile(model_id="m", dim=8).to_manifest().to_dict()
    del old["serializer"]["video"]  # a collection written before videos
    assert CollectionProfile.from_manifest(Manifest.from_dict(old)).video == VideoConfig()
