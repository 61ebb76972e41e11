"""Settings of a Ray run (`faste-mm index --ray ...`), plain data kept apart from the Ray code so
the CLI can build them without importing ray; `faste_mm.scale.RayExecutor` runs with them."""

from __future__ import annotations

from dataclasses import dataclass

from faste_mm.errors import ConfigError


@dataclass(frozen=True, slots=True)
class RayOptions:
    """How `Retriever.index` runs on Ray Data.

    address: "auto" starts a local Ray with every local GPU and core (or joins the cluster
        RAY_ADDRESS names); "host:port" or "ray://host:10001" joins a running cluster. An
        already initialised Ray in this process is used as it is.
    workers: embedding actors, one model each. None: one per GPU (with gpus_per_worker > 0),
        else 1.
    gpus_per_worker: GPUs per actor; None: 1 when the cluster has GPUs, else 0 (CPU actors).
    cpus_per_worker: CPUs each actor reserves (its torch threads and preprocessing threads).
    decode_cpus: CPUs each decoding task reserves (image decoding, PDF rendering).
    ship_bytes: the driver reads every file and ships its bytes through Ray's object store, for
        clusters whose nodes do not see the files at the same path. False: workers read the
        paths themselves (shared storage: NFS, a parallel file system, a bucket mount).
    files_per_call: files handed to an actor per call (its token-budget batching and FastE run
        over their items); a killed actor's call is retried whole.
    files_per_task: files per decoding task.
    """

    address: str = "auto"
    workers: int | None = None
    gpus_per_worker: float | None = None
    cpus_per_worker: float = 1.0
    decode_cpus: float = 1.0
    ship_bytes: bool = False
    files_per_call: int = 16
    files_per_task: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.address, str) or not self.address.strip():
            raise ConfigError(f"RayOptions.address must be 'auto' or a cluster address, got {self.address!r}")
        if self.workers is not None and (not isinstance(self.workers, int) or self.workers < 1):
            raise ConfigError(f"RayOptions.workers must be an int >= 1 or None, got {self.workers!r}")
        if self.gpus_per_worker is not None and self.gpus_per_worker < 0:
            raise ConfigError(f"RayOptions.gpus_per_worker must be >= 0, got {self.gpus_per_worker!r}")
        for name in ("cpus_per_worker", "decode_cpus"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"RayOptions.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("files_per_call", "files_per_task"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"RayOptions.{name} must be an int >= 1, got {value!r}")
