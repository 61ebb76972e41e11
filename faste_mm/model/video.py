"""Video decoding for the serializer: which frames the official Qwen3-VL-Embedding code samples
from a video file (qwen-vl-utils' `smart_nframes` + uniform indices), at what size (its per-frame
pixel budget + `smart_resize`), decoded with PyAV by seeking where the container allows.

Receives a path and a `VideoConfig`; hands `VideoFrames` (resized float frames + the metadata the
processor needs for its `<t seconds>` timestamps) to the serializer. Self-contained: imports only
faste_mm.errors; PyAV, torch and torchvision are imported inside the functions that use them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from faste_mm.errors import ConfigError, InputError
from faste_mm.model.opened_files import OpenedFile, decoder_input, file_name

# qwen-vl-utils 0.0.14 (vision_process.py) constants, with image_patch_size=16 as the official
# embedder passes it: factor = patch 16 x merge 2 = 32 px per merged token side.
FACTOR = 32
FRAME_FACTOR = 2  # frames are paired by the temporal patch; counts are rounded to even
MAX_RATIO = 200
VIDEO_FRAME_MAX_PIXELS = 768 * FACTOR * FACTOR  # VIDEO_MAX_TOKEN_NUM: 786,432 px per frame


@dataclass(frozen=True, slots=True)
class VideoConfig:
    """How a video file is sampled and resized (defaults: the official Qwen3-VL-Embedding embedder).

    fps: frames sampled per second of video (official FPS = 1).
    max_frames: at most this many frames (official MAX_FRAMES = 64; rounded down to even).
    min_frames: at least this many (qwen-vl-utils FPS_MIN_FRAMES = 4), never more than the file has.
    min_pixels: per-frame lower bound (qwen-vl-utils VIDEO_MIN_TOKEN_NUM 128 x 32 x 32 = 131,072).
    max_pixels: per-frame upper bound (qwen-vl-utils VIDEO_MAX_TOKEN_NUM 768 x 32 x 32 = 786,432).
    total_pixels: the whole clip's budget, shared by the frames (per frame: total_pixels / frames
        x 2); the official embedder's MAX_TOTAL_PIXELS = 10 x 768 x 32 x 32 = 7,864,320, which keeps
        64 frames within max_length 8192. See docs/video.md for why this one differs from the
        official file-path code.
    """

    fps: float = 1.0
    max_frames: int = 64
    min_frames: int = 4
    min_pixels: int = 128 * FACTOR * FACTOR
    max_pixels: int = VIDEO_FRAME_MAX_PIXELS
    total_pixels: int = 10 * VIDEO_FRAME_MAX_PIXELS

    def __post_init__(self) -> None:
        if not (isinstance(self.fps, (int, float)) and 0 < self.fps <= 120):
            raise ConfigError(f"VideoConfig.fps must be in (0, 120] frames per second, got {self.fps!r}")
        if not isinstance(self.max_frames, int) or self.max_frames < FRAME_FACTOR:
            raise ConfigError(f"VideoConfig.max_frames must be an int >= {FRAME_FACTOR}, got {self.max_frames!r}")
        if not isinstance(self.min_frames, int) or not 1 <= self.min_frames <= self.max_frames:
            raise ConfigError(
                f"VideoConfig.min_frames must be an int in 1..max_frames ({self.max_frames}), got {self.min_frames!r}"
            )
        if not 1 <= self.min_pixels:
            raise ConfigError(f"VideoConfig.min_pixels must be >= 1 pixel per frame, got {self.min_pixels}")
        if self.max_pixels < self.min_pixels:
            raise ConfigError(f"VideoConfig.max_pixels must be >= min_pixels ({self.min_pixels}) per frame, "
                              f"got {self.max_pixels}")
        if self.total_pixels < self.min_pixels:
            raise ConfigError(
                f"VideoConfig.total_pixels must be >= min_pixels ({self.min_pixels}), got {self.total_pixels}"
            )

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class VideoInfo:
    """What the container header says (no frame decoded): counts as decord/torchcodec report them."""

    total_frames: int
    fps: float  # the stream's average frame rate
    width: int
    height: int


@dataclass(frozen=True, slots=True)
class VideoPlan:
    """The frames to sample and their size, from the header alone."""

    indices: tuple[int, ...]  # frame numbers in presentation order
    height: int
    width: int

    @property
    def tokens(self) -> int:
        """Visual tokens in the decoder: frame pairs x merged 32x32 cells."""
        return len(self.indices) // FRAME_FACTOR * (self.height // FACTOR) * (self.width // FACTOR)


@dataclass(frozen=True, slots=True, eq=False)
class VideoFrames:
    """Sampled, resized frames and the metadata the processor turns into `<t seconds>` prompts."""

    frames: object  # torch.Tensor [T, 3, h, w] float32, integer values 0..255 (as qwen-vl-utils)
    indices: tuple[int, ...]
    fps: float
    total_frames: int

    def metadata(self) -> dict:
        """qwen-vl-utils' `video_metadata` dict (fps, frames_indices, total_num_frames)."""
        return {"fps": self.fps, "frames_indices": list(self.indices), "total_num_frames": self.total_frames}


# -- qwen-vl-utils' pure rules, spelled out (tests compare them with qwen_vl_utils itself) --


def smart_nframes(config: VideoConfig, total_frames: int, video_fps: float) -> int:
    """qwen-vl-utils `smart_nframes` with ele = {fps, max_frames} (min_frames default 4):
    duration x fps, clamped to [min_frames, max_frames] and to the file's frames, floored to even.
    Raises ValueError (like the original) when fewer than 2 frames remain."""
    min_frames = math.ceil(config.min_frames / FRAME_FACTOR) * FRAME_FACTOR
    max_frames = math.floor(config.max_frames / FRAME_FACTOR) * FRAME_FACTOR
    nframes = total_frames / video_fps * config.fps
    nframes = min(min(max(nframes, min_frames), max_frames), total_frames)
    nframes = math.floor(nframes / FRAME_FACTOR) * FRAME_FACTOR
    if not FRAME_FACTOR <= nframes <= total_frames:
        raise ValueError(f"nframes should in interval [{FRAME_FACTOR}, {total_frames}], but got {nframes}.")
    return int(nframes)


def frame_indices(total_frames: int, nframes: int) -> tuple[int, ...]:
    """`torch.linspace(0, total - 1, n).round()`: the decord/torchcodec backends' indices
    (torch rounds half to even, which numpy's linspace + round would also do, but with float64)."""
    import torch

    return tuple(torch.linspace(0, total_frames - 1, nframes).round().long().tolist())


def frame_pixel_budget(config: VideoConfig, nframes: int) -> tuple[int, int]:
    """(min_pixels, max_pixels) of each frame, as `fetch_video` computes them for nframes frames."""
    budget = max(min(VIDEO_FRAME_MAX_PIXELS, config.total_pixels / nframes * FRAME_FACTOR), int(config.min_pixels * 1.05))
    return config.min_pixels, min(config.max_pixels, budget)


def smart_resize(height: int, width: int, min_pixels: int, max_pixels: float) -> tuple[int, int]:
    """qwen-vl-utils `smart_resize` (factor 32): multiples of 32, area within bounds, aspect kept."""
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise ValueError(f"absolute aspect ratio must be smaller than {MAX_RATIO}, got {max(height, width) / min(height, width)}")
    h_bar = max(FACTOR, round(height / FACTOR) * FACTOR)
    w_bar = max(FACTOR, round(width / FACTOR) * FACTOR)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = math.floor(height / beta / FACTOR) * FACTOR
        w_bar = math.floor(width / beta / FACTOR) * FACTOR
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / FACTOR) * FACTOR
        w_bar = math.ceil(width * beta / FACTOR) * FACTOR
    return h_bar, w_bar


def plan_video(path: Path, info: VideoInfo, config: VideoConfig) -> VideoPlan:
    """Frame numbers and frame size for `info` under `config`; InputError when too short or too thin."""
    if info.total_frames < FRAME_FACTOR:
        raise InputError(
            f"{path}: the video has {info.total_frames} frame(s); at least {FRAME_FACTOR} are needed "
            "(frames are paired); embed a single frame as an image instead"
        )
    try:
        nframes = smart_nframes(config, info.total_frames, info.fps)
        height, width = smart_resize(info.height, info.width, *frame_pixel_budget(config, nframes))
    except ValueError as error:
        raise InputError(f"{path}: cannot sample this video ({error})") from None
    return VideoPlan(frame_indices(info.total_frames, nframes), height, width)


# -- decoding with PyAV --


def read_video(path: str | Path | OpenedFile, config: VideoConfig, max_tokens: int | None = None) -> VideoFrames:
    """Decode the frames the official code samples, resized as it resizes them.

    max_tokens: refuse (InputError, before decoding) a video whose visual tokens alone exceed it.

    Seeks to the keyframe before each sampled frame when the gap ahead is longer than the
    keyframe interval seen so far (so a 1 fps sample of a long file decodes a few frames per
    second of video, not all of them); plain sequential decoding otherwise. Raises InputError.
    """
    import torch

    source, path = path, file_name(path)
    with _open(source) as container:
        stream = _video_stream(path, container)
        info = _info(source, container, stream)
        plan = plan_video(path, info, config)
        if max_tokens is not None and plan.tokens > max_tokens:
            raise InputError(
                f"{path}: {len(plan.indices)} frames of {plan.width}x{plan.height} px are {plan.tokens} visual "
                f"tokens, over the limit of {max_tokens} (max_length); sample fewer frames or fewer pixels "
                "per frame (video max_frames / max_pixels; --video-max-frames / --video-max-pixels)"
            )
        frames = [
            _resize(frame.to_ndarray(format="rgb24"), plan.height, plan.width)
            for frame in _decode_at(path, container, stream, info, plan.indices)
        ]
    return VideoFrames(torch.stack(frames), plan.indices, info.fps, info.total_frames)


class _open:
    """`av.open` as a context manager whose errors become InputErrors naming the file. An
    `OpenedFile` (a stored file checked on its descriptor) is read through that descriptor,
    streamed, never opened again by its path."""

    def __init__(self, source: Path | OpenedFile) -> None:
        self.source = source
        self.path = file_name(source)
        self.container = None

    def __enter__(self):
        import av

        path = self.path
        if isinstance(self.source, OpenedFile):  # checked when opened: a regular file
            if self.source.size == 0:
                raise InputError(f"{path}: file is empty (0 bytes); remove it or re-export it")
        elif not path.exists():
            raise InputError(f"{path}: file not found; check the path")
        elif not path.is_file():
            raise InputError(f"{path}: not a regular file")
        elif path.stat().st_size == 0:
            raise InputError(f"{path}: file is empty (0 bytes); remove it or re-export it")
        try:
            self.container = av.open(decoder_input(self.source), mode="r")
        except av.EOFError:
            raise InputError(f"{path}: the file ends before any video frame (empty or truncated); "
                             "re-export the video or remove it") from None
        except av.FFmpegError as error:
            raise InputError(f"{path}: not a readable video (corrupt or unknown container: {error}); "
                             "re-encode it (e.g. ffmpeg -i IN -c:v libx264 OUT.mp4) or remove it") from None
        return self.container

    def __exit__(self, kind, error, traceback) -> None:
        import av

        self.container.close()
        if isinstance(error, av.FFmpegError):  # decoding failed part-way: truncated or corrupt data
            raise InputError(f"{self.path}: the video data is corrupt ({error}); re-encode it or remove it") from None


def _video_stream(path: Path, container):
    if not container.streams.video:
        kinds = sorted({s.type for s in container.streams}) or ["nothing"]
        raise InputError(f"{path}: no video stream (the file holds {', '.join(kinds)}); "
                         "only files with a video track can be embedded")
    stream = container.streams.video[0]
    if stream.codec_context is None or stream.codec_context.codec is None:
        raise InputError(f"{path}: unsupported or unknown video codec (FFmpeg has no decoder for it); "
                         "re-encode it (e.g. ffmpeg -i IN -c:v libx264 OUT.mp4)")
    stream.thread_type = "AUTO"
    return stream


def _info(source: Path | OpenedFile, container, stream) -> VideoInfo:
    path = file_name(source)
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    context = stream.codec_context
    if not rate or not context.width or not context.height:
        raise InputError(f"{path}: the video stream has no frame rate or size; re-encode it")
    total = stream.frames  # nb_frames from the header, as decord and torchcodec read it
    if total <= 0:  # webm/mkv often leave it out: count packets (decodes nothing) on a second handle
        import av

        with av.open(decoder_input(source), mode="r") as counting:
            total = sum(1 for packet in counting.demux(video=0) if packet.size > 0)
    if total <= 0:
        raise InputError(f"{path}: the video stream has no frames; re-export the video or remove it")
    return VideoInfo(total_frames=int(total), fps=float(rate), width=context.width, height=context.height)


def _decode_at(path: Path, container, stream, info: VideoInfo, indices: tuple[int, ...]):
    """Yield the decoded frames with the given frame numbers (sorted, distinct), seeking ahead
    only when the gap to the next one is longer than the keyframe interval learnt so far."""
    time_base = stream.time_base
    start = stream.start_time or 0

    def number(frame) -> int:  # frame number from the presentation time (constant frame rate)
        return round(float((frame.pts - start) * time_base) * info.fps)

    frames = container.decode(stream)
    current = -1  # number of the last decoded frame
    last_key = None  # number of the last keyframe decoded since the last seek
    keyframe_gap = 1  # frames between keyframes as far as seen: a shorter gap is decoded through
    for target in indices:
        seeking = target - current > keyframe_gap
        if seeking:
            # half a frame early, so a rounded time never lands after the frame we want
            container.seek(start + int((target - 0.5) / info.fps / time_base), stream=stream, backward=True)
            frames = container.decode(stream)
            last_key = None
        frame = None
        for frame in frames:
            if frame.pts is None:
                continue
            previous, current = current, number(frame)
            if seeking:
                seeking = False
                if current <= previous:  # back to a keyframe already passed: the seek was wasted
                    keyframe_gap = max(keyframe_gap, target - current)
            if frame.key_frame:
                if last_key is not None:
                    keyframe_gap = max(keyframe_gap, current - last_key)
                last_key = current
            if current >= target:
                break
        else:
            raise InputError(f"{path}: the video ends before frame {target} of {info.total_frames} "
                             "(truncated file or wrong frame count in the header); re-encode it")
        yield frame


def _resize(rgb, height: int, width: int):
    """qwen-vl-utils' resize: torchvision bicubic with antialias on the uint8 frame, then float."""
    import torch
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as tvF

    frame = torch.from_numpy(rgb).permute(2, 0, 1)[None]  # [1, 3, H, W] uint8
    return tvF.resize(frame, [height, width], interpolation=InterpolationMode.BICUBIC, antialias=True).float()[0]
