"""Video items against references: frames and sizes vs qwen-vl-utils' own `fetch_video` (its decord
path, fed by a PyAV full decode), the prompt's timestamps vs transformers 4.57's rendering, the
full forward vs Qwen3VLModel's last_hidden_state, FastE vs the naive per-sample reference, and
each bad input as a per-item failure. Videos are generated here with PyAV: tiny, a few seconds."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import Qwen3VLModel

from faste_mm import FastEConfig, InputError, Item, SerializerConfig
from faste_mm.model.items import as_item
from faste_mm.model.video import VideoConfig, frame_indices, frame_pixel_budget, read_video, smart_nframes, smart_resize

from tests.helpers.reference import init_vl_sample, naive_embed, pool_last_valid, right_padded, serialized_items
from tests.helpers.inputs import write_audio, write_video
from tests.helpers.warm_process import run_python

av = pytest.importorskip("av")


@pytest.fixture(scope="session")
def video_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("videos")
    write_video(root / "short.mp4", 4, 5)  # 20 frames: 4 sampled at 1 fps
    write_video(root / "wide.mkv", 3, 4, size=(96, 32))  # no frame count in the header
    write_video(root / "long_gop.mp4", 12, 10, gop=40)  # seeking lands between keyframes
    return root


# -- sampling and resizing: the same as qwen-vl-utils --


@pytest.mark.parametrize("total_frames, fps", [(20, 5.0), (750, 25.0), (3, 30.0), (100, 29.97), (5000, 24.0), (61, 1.0)])
@pytest.mark.parametrize("config", [VideoConfig(), VideoConfig(fps=2.0, max_frames=16), VideoConfig(min_frames=2, max_frames=7)])
def test_frame_count_and_indices_equal_qwen_vl_utils(total_frames, fps, config):
    import qwen_vl_utils.vision_process as qvu

    ele = {"fps": config.fps, "max_frames": config.max_frames, "min_frames": config.min_frames}
    expected_n = qvu.smart_nframes(ele, total_frames=total_frames, video_fps=fps)
    assert smart_nframes(config, total_frames, fps) == expected_n
    expected_idx = torch.linspace(0, total_frames - 1, expected_n).round().long().tolist()  # its decord backend
    assert list(frame_indices(total_frames, expected_n)) == expected_idx


@pytest.mark.parametrize("height, width", [(48, 64), (1080, 1920), (720, 1280), (32, 3000), (2000, 500)])
@pytest.mark.parametrize("nframes", [2, 20, 64])
def test_frame_size_equals_qwen_vl_utils_smart_resize(height, width, nframes):
    import qwen_vl_utils.vision_process as qvu

    config = VideoConfig()
    min_pixels, max_pixels = frame_pixel_budget(config, nframes)
    # fetch_video's own budget, with image_patch_size=16 as the official embedder passes it
    factor = 16 * qvu.SPATIAL_MERGE_SIZE
    budget = max(min(qvu.VIDEO_MAX_TOKEN_NUM * factor**2, config.total_pixels / nframes * qvu.FRAME_FACTOR),
                 int(qvu.VIDEO_MIN_TOKEN_NUM * factor**2 * 1.05))
    assert (min_pixels, max_pixels) == (qvu.VIDEO_MIN_TOKEN_NUM * factor**2, budget)
    expected = qvu.smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    assert smart_resize(height, width, min_pixels, max_pixels) == expected


_FETCHED_VIDEOS = ["short.mp4", "wide.mkv", "long_gop.mp4"]
_FETCH_CONFIGS = [
    VideoConfig(),
    VideoConfig(total_pixels=int(128000 * 32 * 32 * 0.9)),  # the official file-path call: qwen-vl-utils' default
    VideoConfig(fps=2.0, max_frames=8, min_pixels=4096, total_pixels=40_000),  # the clip budget binds
]
# qwen-vl-utils' `fetch_video` on each element, its decord path chosen by its own setting
# (FORCE_QWENVL_VIDEO_READER) and served by the stand-in on this process's path (argv[1]).
_FETCH_VIDEO = """
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
import qwen_vl_utils.vision_process as qvu
backend = qvu.get_video_reader_backend()
if backend != "decord":
    sys.exit(f"qwen-vl-utils chose its {backend} reader, not decord (FORCE_QWENVL_VIDEO_READER)")
elements = json.loads(sys.argv[2])
torch.save({key: qvu.fetch_video(ele, image_patch_size=16, return_video_metadata=True) for key, ele in elements.items()},
           sys.argv[3])
"""


@pytest.fixture(scope="module")
def fetched(video_dir, tmp_path_factory) -> dict:
    """(frames, metadata) from qwen-vl-utils' `fetch_video` for each video and config, computed in
    a process of its own: qwen-vl-utils reads its reader setting when imported, and the decord it
    reads with is the stand-in in tests/helpers/stand_ins (nothing of either is patched)."""
    elements = {}
    for name in _FETCHED_VIDEOS:
        for k, config in enumerate(_FETCH_CONFIGS):
            elements[f"{name} {k}"] = {"video": "file://" + str(video_dir / name), "fps": config.fps,
                                       "max_frames": config.max_frames, "min_pixels": config.min_pixels,
                                       "total_pixels": config.total_pixels}
    out = tmp_path_factory.mktemp("fetched") / "fetched.pt"
    stand_ins = Path(__file__).parent / "helpers" / "stand_ins"
    result = run_python(_FETCH_VIDEO, [str(stand_ins), json.dumps(elements), str(out)],
                        env={**os.environ, "FORCE_QWENVL_VIDEO_READER": "decord"})
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(out)


@pytest.mark.parametrize("name", _FETCHED_VIDEOS)
@pytest.mark.parametrize("config", _FETCH_CONFIGS)
def test_decoded_frames_equal_qwen_vl_utils_fetch_video(video_dir, fetched, name, config):
    expected, metadata = fetched[f"{name} {_FETCH_CONFIGS.index(config)}"]
    got = read_video(video_dir / name, config)
    assert list(got.indices) == list(metadata["frames_indices"])
    assert (got.fps, got.total_frames) == (metadata["fps"], metadata["total_num_frames"])
    assert got.frames.shape == expected.shape
    torch.testing.assert_close(got.frames, expected, atol=0, rtol=0)


def test_prompt_carries_official_timestamps_without_nested_vision_markers(vl_embedder, video_dir):
    serializer = vl_embedder.serializer
    item = Item(video=video_dir / "short.mp4", text="a clip")
    video = read_video(item.video, serializer.config.video)
    serialized = serializer(item, None)
    pad = serializer.processor.video_token
    text = serializer.processor.tokenizer.decode(serialized.input_ids).replace(pad, "")
    # transformers 4.57 (the official pin): "<t seconds><|vision_start|>pads<|vision_end|>" per pair
    stamps = [(video.indices[i] + video.indices[i + 1]) / 2 / video.fps for i in range(0, len(video.indices), 2)]
    frames = "".join(f"<{t:.1f} seconds><|vision_start|><|vision_end|>" for t in stamps)
    assert f"<|im_start|>user\n{frames}a clip<|im_end|>" in text
    t, h, w = serialized.video_grid_thw[0].tolist()
    assert t == len(video.indices) // 2 and (h * 16, w * 16) == tuple(video.frames.shape[-2:])
    assert int((serialized.input_ids == serializer.video_token_id).sum()) == t * h * w // 4


def test_a_path_with_a_video_suffix_is_a_video_item(video_dir):
    assert as_item(video_dir / "wide.mkv", 0).video == video_dir / "wide.mkv"
    assert as_item(Path("clip.MOV"), 0).has_video


# -- the model: Full vs HF, FastE vs the naive reference --


@pytest.fixture(scope="session")
def video_items(video_dir, image_dir):
    """Video rows mixed with text and image rows in one batch (HF's joint DeepStack path), and
    one row holding a video, an image and text (content order video, image, text)."""
    return [
        Item(video=video_dir / "short.mp4"),
        "a red bicycle leaning on a wall",
        Item(video=video_dir / "wide.mkv", text="people walking in a park"),
        Item(image=image_dir / "red.png", text="a red square"),
        Item(video=video_dir / "short.mp4", image=image_dir / "gray.jpg", text="both", instruction="Find the clip."),
    ]


def test_full_forward_on_videos_matches_qwen3vl_last_hidden_state(vl_embedder, model_dirs, video_items):
    serialized = serialized_items(vl_embedder, video_items)
    ids, mask, mm = right_padded(serialized, vl_embedder.loaded.pad_token_id)
    model = Qwen3VLModel.from_pretrained(str(model_dirs["qwen3_vl"])).eval()
    with torch.no_grad():
        out = model(
            input_ids=ids, attention_mask=mask, mm_token_type_ids=mm,
            pixel_values=torch.cat([s.pixel_values for s in serialized if s.pixel_values is not None]),
            image_grid_thw=torch.cat([s.image_grid_thw for s in serialized if s.image_grid_thw is not None]),
            pixel_values_videos=torch.cat([s.pixel_values_videos for s in serialized if s.pixel_values_videos is not None]),
            video_grid_thw=torch.cat([s.video_grid_thw for s in serialized if s.video_grid_thw is not None]),
        )
    res = vl_embedder.encode(video_items)
    np.testing.assert_allclose(res.embeddings, pool_last_valid(out.last_hidden_state, mask), atol=1e-5)


@pytest.mark.parametrize("trigger_layer", [1, 4])  # before and after the DeepStack layers 0..2
def test_faste_on_videos_matches_naive_reference(vl_embedder, model_dirs, video_items, trigger_layer):
    model = Qwen3VLModel.from_pretrained(str(model_dirs["qwen3_vl"])).eval()
    with torch.no_grad():
        samples = [init_vl_sample(model, s) for s in serialized_items(vl_embedder, video_items)]
        expected, trigger, _ = naive_embed(
            list(model.language_model.layers), model.language_model.norm, samples, r_max=0.6, trigger_layer=trigger_layer
        )
    res = vl_embedder.encode(video_items, fast_e=FastEConfig(r_max=0.6, trigger_layer=trigger_layer))
    assert [t.trigger_layer for t in res.stats.batches] == [trigger]
    np.testing.assert_allclose(res.embeddings, expected.numpy(), atol=2e-5)


def test_vision_flops_count_the_video_grids(vl_embedder, video_items):
    from faste_mm.model.flops import vision_flops

    serialized = serialized_items(vl_embedder, video_items)
    grids = [tuple(g) for s in serialized for g in (s.image_grid_thw, s.video_grid_thw) if g is not None for g in g.tolist()]
    res = vl_embedder.encode(video_items)
    assert sorted(g for t in res.stats.batches for g in t.image_grids + t.video_grids) == sorted(grids)
    assert res.stats.flops_vision == vision_flops(vl_embedder.backbone.vision_shape, grids)


# -- bad input: a per-item failure naming the file; the other items still embed --


def _bad_files(root: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, a phrase its failure must contain)."""
    root.mkdir(exist_ok=True)
    corrupt = root / "corrupt.mp4"
    corrupt.write_bytes(np.random.default_rng(0).bytes(4000))
    mkv = write_video(root / "source.mkv", 2, 5).read_bytes()
    clusters = mkv.find(bytes.fromhex("1F43B675"))  # Matroska Cluster: the frames start here
    headers_only = root / "no_frames.mkv"
    headers_only.write_bytes(mkv[:clusters])
    unknown = root / "unknown_codec.mkv"
    unknown.write_bytes(mkv.replace(b"V_MPEG4/ISO/AVC", b"V_QWERTY/XX/ZZZ"))  # same length: a valid file
    return {
        "corrupt": (corrupt, "not a readable video"),
        "zero frames": (headers_only, "ends before any video frame"),
        "one frame": (write_video(root / "one.mp4", 1, 1), "1 frame(s)"),
        "audio only": (write_audio(root / "speech.m4a"), "no video stream"),
        "unsupported codec": (unknown, "unsupported or unknown video codec"),
        "missing": (root / "nowhere.mp4", "file not found"),
    }


def test_each_bad_video_is_a_failure_naming_the_file_and_the_rest_embed(vl_embedder, video_dir, tmp_path):
    bad = _bad_files(tmp_path / "bad")
    inputs = ["good text", *[Item(video=path) for path, _ in bad.values()], Item(video=video_dir / "short.mp4")]
    res = vl_embedder.encode(inputs, on_error="skip")
    assert res.ok.tolist() == [True] + [False] * len(bad) + [True]
    reasons = {f.index: f.reason for f in res.failures}
    for row, (path, phrase) in enumerate(bad.values(), start=1):
        assert str(path) in reasons[row] and phrase in reasons[row], reasons[row]
    alone = vl_embedder.encode([Item(video=video_dir / "short.mp4")]).embeddings
    np.testing.assert_allclose(res.embeddings[-1], alone[0], atol=1e-5)


def test_bad_video_raises_input_error_by_default(vl_embedder, tmp_path):
    path, _ = _bad_files(tmp_path / "bad")["audio only"]
    with pytest.raises(InputError, match="no video stream") as caught:
        vl_embedder.encode([Item(video=path)])
    assert str(path) in str(caught.value)


def test_a_video_over_the_token_limit_names_the_limit_and_how_to_lower_it(vl_embedder, video_dir):
    clip = video_dir / "long_gop.mp4"  # 12 s: 12 frames at 1 fps = 6 pairs of at least 130 tokens
    small = vl_embedder.with_serializer(SerializerConfig(max_length=512))
    res = small.encode([Item(video=clip), "fine"], on_error="skip")
    assert res.ok.tolist() == [False, True]
    reason = res.failures[0].reason
    assert str(clip) in reason and "512" in reason and "--video-max-frames" in reason and "--video-max-pixels" in reason
    fewer = vl_embedder.with_serializer(SerializerConfig(max_length=512, video=VideoConfig(max_frames=4)))
    assert fewer.encode([Item(video=clip)]).ok.all()


def test_text_only_models_refuse_videos(text_embedders, video_dir):
    res = text_embedders["qwen3"].encode([Item(video=video_dir / "short.mp4"), "text"], on_error="skip")
    assert res.ok.tolist() == [False, True] and "cannot embed videos" in res.failures[0].reason


def test_bench_video_input_is_a_decodable_clip_of_the_asked_length(tmp_path):
    from faste_mm.bench.inputs import make_inputs
    from faste_mm.errors import ConfigError
    clips = make_inputs("video:2@64x48", 3, tmp_path, None)
    assert len(clips) == 3 and len(set(clips)) == 1
    with av.open(str(clips[0])) as container:
        stream = container.streams.video[0]
        frames = sum(1 for _ in container.decode(stream))
        assert (frames, float(stream.average_rate), stream.width, stream.height) == (50, 25.0, 64, 48)
    with pytest.raises(ConfigError, match="video:SECONDS"):
        make_inputs("video:long", 1, tmp_path, None)
