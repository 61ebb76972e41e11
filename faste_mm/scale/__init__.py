"""Scale-out front ends: `Retriever.index(..., executor=RayExecutor(RayOptions(...)))` runs the
embedding on a Ray Data pipeline (faste_mm.scale.ray_index). Importing this package loads neither
ray nor torch."""

from faste_mm.scale.executor import RayExecutor
from faste_mm.scale.options import RayOptions

__all__ = ["RayExecutor", "RayOptions"]
