"""`RayExecutor`: the `IngestExecutor` of `index --ray`. It takes the retriever's `IngestJob`
(the collection's profile, the plan, the driver's model) and runs it on a Ray Data pipeline
(`faste_mm.scale.ray_index`); importing this module loads neither ray nor torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from faste_mm.retrieval.executors import IngestJob
from faste_mm.scale.options import RayOptions


@dataclass(frozen=True, slots=True)
class RayExecutor:
    """Embeds an index run's plan on Ray: decoding in Ray tasks, embedding in an actor pool, each
    chunk committed by the driver as its results come back (see `faste_mm.scale.ray_index`).

    Example: `Retriever(...).index(paths, executor=RayExecutor(RayOptions("auto")))`.
    """

    options: RayOptions = field(default_factory=RayOptions)

    def run(self, job: IngestJob) -> None:
        from faste_mm.scale.ray_index import ingest_plan_with_ray

        ingest_plan_with_ray(job, self.options)
