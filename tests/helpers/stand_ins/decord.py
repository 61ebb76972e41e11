"""A stand-in for the `decord` package (it has no wheels for recent Pythons), for one use: the
process of its own in which tests/test_video.py runs qwen-vl-utils' `fetch_video` down its own
decord path, the reference for faste-mm's frames. `VideoReader` decodes the whole file with PyAV;
qwen-vl-utils samples, indexes and resizes as it does with decord. Only that process has this
folder on its path."""

from __future__ import annotations

import types

import av
import numpy as np


class VideoReader:
    def __init__(self, path: str) -> None:
        with av.open(path.removeprefix("file://")) as container:
            stream = container.streams.video[0]
            self.fps = float(stream.average_rate)
            self.frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(stream)])

    def __len__(self) -> int:
        return len(self.frames)

    def get_avg_fps(self) -> float:
        return self.fps

    def get_batch(self, indices):
        return types.SimpleNamespace(asnumpy=lambda: self.frames[indices])
