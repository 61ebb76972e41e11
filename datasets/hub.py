"""Evaluation data from the Hugging Face hub: the MMEB_Test_Instruct parquet of each task and the
MMEB image archive, downloaded with `huggingface_hub` (never the `datasets` library) into a cache
directory laid out exactly as `mmeb.load_task` reads a local `--data DIR`.

Cache layout: CACHE/<subset>/*.parquet (hub paths kept) and CACHE/images/ (archive extracted;
a `.complete` marker is written last, so an interrupted extraction is redone, not trusted).
"""

from __future__ import annotations

import logging
import os
import shutil
import tarfile
from pathlib import Path

from faste_mm.errors import InputError, ModelLoadError

from faste_mm.datasets.mmeb import TaskSpec

log = logging.getLogger(__name__)

DATA_REPO = "ziyjiang/MMEB_Test_Instruct"
IMAGE_REPO = "TIGER-Lab/MMEB-V2"
IMAGE_ARCHIVE = "image-tasks/mmeb_v1.tar.gz"
_COMPLETE = ".complete"


def default_cache_dir() -> Path:
    """Per-user cache, e.g. ~/.cache/faste-mm/mmeb on Linux."""
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("faste-mm")) / "mmeb"


def download_tasks(specs: list[TaskSpec], cache_dir: str | Path | None = None, *, images: bool = True) -> Path:
    """Download the parquet of each task (and the image archive) into `cache_dir`; returns it.

    Files already in the cache are reused (huggingface_hub checks them against the hub when
    online). Raises ModelLoadError when the hub cannot be reached and the cache lacks a file.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        _download_subset(spec.subset, cache)
    if images and any(spec.query_image or spec.candidate_image for spec in specs):
        _download_images(cache)
    return cache


def _download_subset(subset: str, cache: Path) -> None:
    from huggingface_hub import hf_hub_download

    try:
        files = [f for f in _data_repo_files() if f.startswith(f"{subset}/") and f.endswith(".parquet")]
    except Exception as error:  # offline, DNS, HTTP errors: all mean "cannot list the hub"
        if sorted((cache / subset).glob("*.parquet")):
            log.warning("hub unreachable (%s); using the cached %s parquet", type(error).__name__, subset)
            return
        raise ModelLoadError(
            f"cannot reach the Hugging Face hub to list {DATA_REPO} ({type(error).__name__}: {error}); "
            f"connect to the internet, or download the MMEB_Test_Instruct files yourself and pass --data DIR"
        ) from None
    if not files:
        raise InputError(f"{DATA_REPO} has no parquet file for task {subset} (looked under {subset}/)")
    for name in files:
        log.info("downloading %s/%s", DATA_REPO, name)
        _hub_download(hf_hub_download, DATA_REPO, name, cache)


def _data_repo_files() -> list[str]:
    """Every file name in DATA_REPO, asked of the hub (raises what the hub client raises when
    the hub cannot be reached: the one request whose failure means "use the cache")."""
    from huggingface_hub import HfApi

    return HfApi().list_repo_files(DATA_REPO, repo_type="dataset")


def _download_images(cache: Path) -> None:
    from huggingface_hub import hf_hub_download

    target = cache / "images"
    if (target / _COMPLETE).is_file():
        return
    archive = _hub_download(hf_hub_download, IMAGE_REPO, IMAGE_ARCHIVE, cache / "archives")
    extract_archive(archive, target)


def _hub_download(hf_hub_download, repo: str, name: str, local_dir: Path) -> Path:
    try:
        return Path(hf_hub_download(repo, name, repo_type="dataset", local_dir=str(local_dir)))
    except Exception as error:
        raise ModelLoadError(
            f"cannot download {name} from {repo} ({type(error).__name__}: {error}); check the connection "
            f"(and HF_TOKEN if the data set is gated), or pass --data DIR with local files"
        ) from None


def extract_archive(archive: Path, target: Path) -> None:
    """Extract a .tar(.gz) into `target` atomically: a sibling temp folder renamed when complete."""
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    log.info("extracting %s into %s", archive, target)
    try:
        with tarfile.open(archive) as tar:
            # "data" refuses absolute paths, links out of the folder and device files.
            tar.extractall(partial, filter="data")
    except (tarfile.TarError, OSError) as error:
        shutil.rmtree(partial, ignore_errors=True)
        raise InputError(f"{archive}: cannot extract the image archive ({error}); delete it and retry") from None
    (partial / _COMPLETE).write_text("ok\n")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(partial, target)
