"""The choices of how a collection stores its vectors, as plain data (no numpy): the manifest
checks them, the profile offers them, `quantization` implements them.
"""

from __future__ import annotations

VECTOR_DTYPES = ("float16", "float32")  # the float copy on disk
PRECISIONS = ("float32", "float16", "int8", "binary")  # the index in RAM (`vectors`)
KEEPS = ("float", "int8", "none")  # the copy kept on disk to rescore with (`keep`)
METRICS = ("ip",)
