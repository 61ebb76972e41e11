"""`index --ray`: a local Ray (2 CPUs, no dashboard), 2 CPU embedding actors, a tiny model on disk.

The reference is always the single-process `index` of the same folder: same (uri, page) rows,
same failure rows, vectors equal within float tolerance. FastE's trigger is a batch-mean
decision, so vectors depend on which items share a batch: at r_max > 0 both runs use
max_batch_size=1 (each item alone), and r_max = 0 (no trigger) is compared with the default
batching.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="needs faste-mm[ray]")
pytest.importorskip("ray.data", reason="needs faste-mm[ray]")

from faste_mm import BatchingConfig, Retriever  # noqa: E402
from faste_mm.indexers import Collection  # noqa: E402
from faste_mm.indexers.crash_points import CRASH_ENV  # noqa: E402
from faste_mm.retrieval.results import IndexOptions  # noqa: E402
from faste_mm.retrieval.retriever import ModelSpec  # noqa: E402
from faste_mm.scale import RayExecutor, RayOptions  # noqa: E402
from faste_mm.retrieval.decoders import Decoded  # noqa: E402
from faste_mm.retrieval.profile import CollectionProfile  # noqa: E402
from faste_mm.scale.ray_index import ACTOR_REGISTRY_ENV  # noqa: E402
from faste_mm.scale.ray_workers import PAGES_PER_PART, FileTask, ShippedFile, decode_file_parts, embedder_input  # noqa: E402
from faste_mm.model.serialization import SerializerConfig  # noqa: E402
from faste_mm.scale.resources import plan_resources  # noqa: E402
from tests.helpers.inputs import (CORPUS_EMBEDDED, CORPUS_FAILED, CORPUS_REUSED, make_corpus,  # noqa: E402
                                           noise_image, tiny_vl_dir)

PAGE_PIXELS = 64 * 64  # long PDFs' pages rendered small: the test is about commits, not pixels
# Two actors on two logical CPUs leave room for the decoding tasks.
ACTORS = dict(workers=2, cpus_per_worker=0.5, decode_cpus=0.5, files_per_call=2, files_per_task=2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_vl_dir(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("ray-corpus") / "files")


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory) -> Path:
    """The mixed corpus plus 30 more images (enough work left after the first commit to kill
    something mid-run) and two copies of files committed in earlier chunks."""
    root = make_corpus(tmp_path_factory.mktemp("ray-big") / "files")
    for i in range(30):
        noise_image(root / f"extra{i:02d}.png", (48 + i, 40), 100 + i)
    # Copies far from their originals (other chunks): one of a good image, reused from the stored
    # vector, and one of a bad file, embedded (and failed) again, as a plain run does.
    (root / "zz_gray_again.jpg").write_bytes((root / "gray.jpg").read_bytes())
    (root / "zz_empty_again.jpg").write_bytes(b"")
    return root


@pytest.fixture(scope="module")
def plain_big(model_dir, big_corpus, tmp_path_factory):
    """The single-process reference for big_corpus (r_max=0, default batching), indexed once for
    the tests that compare a Ray run with it (they only read it): (report, collection)."""
    collection = tmp_path_factory.mktemp("ray-big-plain") / "plain"
    return _index(model_dir, big_corpus, collection, 0.0), collection


def _spec(model_dir: Path, max_batch_size: int = 64) -> ModelSpec:
    return ModelSpec(str(model_dir), device="cpu", batching=BatchingConfig(max_batch_size=max_batch_size))


def _index(model_dir, root, collection, r_max, ray_options=None, max_batch_size=64, progress=None, video=None,
           max_pixels=None):
    with Retriever(_spec(model_dir, max_batch_size), collection=collection, r_max=r_max, video=video,
                   max_pixels=max_pixels) as retriever:
        return retriever.index([root], options=IndexOptions(chunk_files=3), progress=progress,
                               executor=None if ray_options is None else RayExecutor(ray_options))


def _rows(collection: Path) -> tuple[dict[tuple[str, int | None], np.ndarray], list[tuple]]:
    """Live (uri, page) -> vector (asserting each once), and the failure rows (uri, page, error)."""
    with Collection.open(collection) as col:
        ids = sorted(col.live_ids(range(10_000)))
        records = col.get(ids)
        vectors = col.vectors(ids)
        failures = sorted((r.uri, r.page, r.error) for r in col.failures())
    keys = [(r.uri, r.page) for r in records]
    assert len(keys) == len(set(keys)), "an item was stored twice"
    return dict(zip(keys, vectors)), failures


def _assert_same_collection(reference: Path, other: Path) -> None:
    ref_rows, ref_failures = _rows(reference)
    rows, failures = _rows(other)
    assert sorted(rows) == sorted(ref_rows)
    assert failures == ref_failures
    for key, vector in ref_rows.items():
        # Stored as float16: batches of other sizes (the pipeline's) move float32 results by ~1e-7,
        # which can flip the last float16 bit (2**-14 = 6.1e-5 for values in [0.0625, 0.125)).
        np.testing.assert_allclose(rows[key], vector, atol=2e-4, err_msg=str(key))


def test_ray_index_with_faste_matches_plain_index(ray_cluster, model_dir, corpus, tmp_path):
    r_max, max_batch_size = 0.5, 1  # one item per batch: FastE triggers per item in both runs
    plain = _index(model_dir, corpus, tmp_path / "plain", r_max, max_batch_size=max_batch_size)
    seen = []
    report = _index(model_dir, corpus, tmp_path / "ray", r_max, RayOptions(**ACTORS), max_batch_size,
                    progress=seen.append)
    assert (report.embedded, report.reused, report.failed) == (CORPUS_EMBEDDED, CORPUS_REUSED, CORPUS_FAILED)
    assert (report.embedded, report.reused, report.failed) == (plain.embedded, plain.reused, plain.failed)
    assert sorted(f.to_dict().items() for f in report.failures) == sorted(f.to_dict().items() for f in plain.failures)
    assert (report.prefix_tokens, report.kept_prefix_tokens) == (plain.prefix_tokens, plain.kept_prefix_tokens)
    _assert_same_collection(tmp_path / "plain", tmp_path / "ray")
    assert seen[-1].files_done == seen[-1].files_total == plain.files_scanned
    assert [p.files_done for p in seen] == sorted(p.files_done for p in seen)
    # A second run finds nothing to do, as a plain one would.
    again = _index(model_dir, corpus, tmp_path / "ray", r_max, RayOptions(**ACTORS), max_batch_size)
    assert (again.embedded, again.reused, again.unchanged) == (0, 0, plain.files_scanned)


def test_ray_index_embeds_videos_with_the_collection_video_settings(ray_cluster, model_dir, tmp_path):
    """The Ray executor decodes each kind with the plain path's decoder and its workers sample
    videos with the collection's video settings (it once recorded every video as an unreadable
    image) and resize images with its pixel budget (`index --ray --max-pixels`): rows, failures
    and vectors equal a plain run's, and the manifest records both."""
    from tests.helpers.inputs import write_video

    folder = tmp_path / "files"
    folder.mkdir()
    write_video(folder / "clip.mp4", 1, 8)
    (folder / "broken.webm").write_bytes(b"not a video")
    noise_image(folder / "photo.png", (160, 128), 3)  # 20,480 px: the budget below shrinks it
    video = {"fps": 4.0, "max_frames": 6}  # not the defaults: the workers must get them
    budget = 8 * 32 * 32  # 8 visual tokens
    plain = _index(model_dir, folder, tmp_path / "plain", 0.0, video=video, max_pixels=budget)
    report = _index(model_dir, folder, tmp_path / "ray", 0.0, RayOptions(**ACTORS), video=video, max_pixels=budget)
    assert (plain.embedded, plain.failed) == (report.embedded, report.failed) == (2, 1)
    assert sorted(f.to_dict().items() for f in report.failures) == sorted(f.to_dict().items() for f in plain.failures)
    _assert_same_collection(tmp_path / "plain", tmp_path / "ray")
    with Collection.open(tmp_path / "ray") as col:
        assert col.manifest.video["max_frames"] == 6
        assert col.manifest.max_pixels == budget
    # the budget changed the photo's vector (a worker ignoring it would have matched this run)
    full = _index(model_dir, folder, tmp_path / "full", 0.0, video=video)
    assert full.embedded == 2
    photo = [key for key in _rows(tmp_path / "ray")[0] if key[0].endswith("photo.png")]
    assert len(photo) == 1
    assert not np.allclose(_rows(tmp_path / "full")[0][photo[0]], _rows(tmp_path / "ray")[0][photo[0]], atol=1e-3)


def test_a_shipped_video_is_written_where_the_actor_embeds_it(tmp_path):
    item = embedder_input(Decoded(None, ShippedFile("clip.mp4", b"bytes of a video")), tmp_path / "0")
    assert item.video == tmp_path / "0" / "clip.mp4" and item.video.read_bytes() == b"bytes of a video"


@ray.remote(num_cpus=0)
class _Registry:
    """Collects the handles of the embedding actors (ACTOR_REGISTRY_ENV test hook); `first`
    blocks until one has registered (an async actor: no polling)."""

    def __init__(self) -> None:
        self.handles = []
        self.added = asyncio.Event()

    async def add(self, handle) -> None:
        self.handles.append(handle)
        self.added.set()

    async def first(self):
        await self.added.wait()
        return self.handles[0]

    async def get(self) -> list:
        return list(self.handles)


def test_killed_actor_is_restarted_and_nothing_is_lost_or_duplicated(ray_cluster, model_dir, big_corpus, plain_big,
                                                                     tmp_path, monkeypatch):
    """Also the full forward (r_max=0, default batching) with bytes shipped through the object
    store, against a plain run: the same collection, bad files included."""
    registry = _Registry.options(name="faste-mm-test-registry").remote()
    monkeypatch.setenv(ACTOR_REGISTRY_ENV, "faste-mm-test-registry")
    killed = []

    def kill_one_after_first_commit(progress) -> None:
        if progress.files_done > 0 and not killed:
            ray.kill(ray.get(registry.first.remote(), timeout=300), no_restart=False)
            killed.append(progress.files_done)

    report = _index(model_dir, big_corpus, tmp_path / "ray", 0.0, RayOptions(**ACTORS, ship_bytes=True),
                    progress=kill_one_after_first_commit)
    assert killed and killed[0] < report.files_scanned, "the actor was not killed mid-run"
    assert len(ray.get(registry.get.remote())) > ACTORS["workers"], "the killed actor did not restart"
    plain, plain_collection = plain_big
    assert (report.embedded, report.reused, report.failed) == (plain.embedded, plain.reused, plain.failed)
    assert sorted(f.to_dict().items() for f in report.failures) == sorted(f.to_dict().items() for f in plain.failures)
    _assert_same_collection(plain_collection, tmp_path / "ray")
    ray.kill(registry)


_DRIVER = """
import sys
from faste_mm.cli.app import main
sys.argv = ["faste-mm", "index", sys.argv[1], "-c", sys.argv[2], "--model", sys.argv[3], "--device", "cpu",
            "--r-max", "0", "--chunk-files", "2", "--ray", sys.argv[4], "--workers", "2",
            "--cpus-per-worker", "0.5", *sys.argv[5:]]
main()
"""


def test_sigkilled_driver_resumes_without_embedding_twice(ray_cluster, model_dir, big_corpus, plain_big, tmp_path):
    """The driver SIGKILLs itself right after its second chunk commit (a named crash point, no
    polling); a re-run embeds only what is missing. The driver runs as the refusal message
    suggests for 2 workers on this 2-CPU cluster (--cpus-per-worker 0.5, decoding 1 CPU)."""
    collection = tmp_path / "ray"
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    env[CRASH_ENV] = "add-after-commit#2"
    proc = subprocess.run([sys.executable, "-c", _DRIVER, str(big_corpus), str(collection), str(model_dir),
                           ray_cluster], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                          timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    # Ray's own output stays off the terminal without --debug (no execution banner, no actor logs)
    assert "Traceback" not in proc.stderr and "streaming_executor" not in proc.stderr, proc.stderr[-3000:]
    # nor the warnings of Ray's Python loggers ("2026-... WARNING file.py:85 -- Token authentication ...")
    assert not re.search(r"^\d{4}-\d\d-\d\d [\d:,]+\s+(WARNING|INFO) ", proc.stderr, re.MULTILINE), proc.stderr[-3000:]
    before, _ = _rows(collection)
    assert 0 < len(before)

    again = _index(model_dir, big_corpus, collection, 0.0, RayOptions(**ACTORS))
    plain, plain_collection = plain_big
    total_items = plain.embedded + plain.reused
    assert len(before) + again.embedded + again.reused == total_items  # nothing embedded twice
    assert again.embedded < plain.embedded
    _assert_same_collection(plain_collection, collection)


def test_a_driver_killed_after_a_page_range_resumes_the_pdf_mid_file(ray_cluster, model_dir, tmp_path):
    """A PDF of more than --chunk-pages pages is committed range by range as its parts come
    back; the driver SIGKILLs itself after the first range (a named crash point), and the
    re-run embeds only the pages after it. The result equals a plain run's."""
    from tests.helpers.inputs import pdf_of_sizes

    docs = tmp_path / "docs"
    docs.mkdir()
    n_pages = PAGES_PER_PART + 4
    pdf_of_sizes(docs / "long.pdf", [(200, 300), (300, 200)] * (n_pages // 2), marks=1)
    noise_image(docs / "photo.png", (40, 40), 5)
    spec = ModelSpec(str(model_dir), device="cpu", serializer=SerializerConfig(max_pixels=PAGE_PIXELS))
    options = IndexOptions(chunk_files=3, chunk_pages=8)
    for name in ("ray", "plain"):  # both collections embed pages at the small pixel cap
        with Retriever(spec, collection=tmp_path / name, r_max=0.0) as creator:
            creator.index([docs / "photo.png"], options=options)
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    env[CRASH_ENV] = "index-after-page-range"
    proc = subprocess.run([sys.executable, "-c", _DRIVER, str(docs), str(tmp_path / "ray"), str(model_dir),
                           ray_cluster, "--chunk-pages", "8"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, env=env, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    before, _ = _rows(tmp_path / "ray")
    committed = sorted(page for uri, page in before if uri.endswith("long.pdf"))
    assert committed == list(range(1, PAGES_PER_PART + 1))  # the first part, one range (>= 8 pages)

    with Retriever(spec, collection=tmp_path / "ray", r_max=0.0) as again:
        resumed = again.index([docs], options=options, executor=RayExecutor(RayOptions(**ACTORS)))
    assert (resumed.embedded, resumed.failed) == (n_pages - PAGES_PER_PART, 0)  # only the pages after it
    with Retriever(spec, collection=tmp_path / "plain", r_max=0.0) as plain:
        assert plain.index([docs], options=options).embedded == n_pages
    _assert_same_collection(tmp_path / "plain", tmp_path / "ray")
    with Collection.open(tmp_path / "ray") as col:  # every row of the file now carries its stat
        records = col.get(sorted(col.live_ids(range(10_000))))
    assert {r.mtime for r in records if r.uri.endswith("long.pdf")} == {(docs / "long.pdf").stat().st_mtime}


def test_a_path_a_worker_cannot_see_is_a_failure_that_says_what_to_do(ray_cluster, tmp_path):
    task = FileTask(str(tmp_path / "only-on-the-driver.png"), "image", None)
    (([row], parts),) = decode_file_parts(task, CollectionProfile(), None, driver_node="another-node")
    assert parts == 1
    assert row.value is None
    assert str(tmp_path / "only-on-the-driver.png") in row.reason
    assert "not visible on Ray node" in row.reason and "--ship-bytes" in row.reason
    # On the driver's own node a vanished file is reported as a plain run reports it.
    (([row], _),) = decode_file_parts(task, CollectionProfile(), None, driver_node=ray.get_runtime_context().get_node_id())
    assert "file not found" in row.reason


def test_missing_ray_says_how_to_install_it(monkeypatch):
    from faste_mm.errors import ConfigError
    from faste_mm.scale import ray_index

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConfigError, match=r"pip install 'faste-mm\[ray\]'"):
        ray_index.import_ray()


def test_cli_ray_flags_need_ray_and_options_are_checked(tmp_path):
    from typer.testing import CliRunner

    from faste_mm.cli.app import app
    from faste_mm.errors import ConfigError

    result = CliRunner().invoke(app, ["index", str(tmp_path), "-c", str(tmp_path / "col"), "--workers", "2"])
    assert result.exit_code == 2 and "--ray" in result.output
    for bad in (dict(workers=0), dict(cpus_per_worker=0), dict(files_per_call=0), dict(address=" ")):
        with pytest.raises(ConfigError):
            RayOptions(**bad)


# ---- resources: a run that can always make progress, or a refusal saying what would ----------
def _plans_leave_decoding_cpu(cluster: dict, options: RayOptions) -> None:
    plan = plan_resources(options, cluster)
    assert plan.decode_cpus > 0
    assert plan.workers * plan.cpus_per_worker + plan.decode_cpus <= cluster.get("CPU", 0) + 1e-9
    assert plan.workers * plan.gpus_per_worker <= cluster.get("GPU", 0)


@pytest.mark.parametrize("cpus", [1, 2, 3, 4, 8, 16])
@pytest.mark.parametrize("gpus", [0, 1, 4])
def test_every_plan_leaves_cpu_for_decoding_and_every_refusal_names_options_that_run(cpus, gpus):
    from faste_mm.errors import ConfigError

    cluster = {"CPU": float(cpus), **({"GPU": float(gpus)} if gpus else {})}
    for workers in (None, 1, 2, 3, 4, 8, 16):
        for cpus_per_worker in (0.25, 0.5, 1.0, 2.0, 4.0):
            options = RayOptions(workers=workers, cpus_per_worker=cpus_per_worker)
            try:
                _plans_leave_decoding_cpu(cluster, options)
            except ConfigError as error:
                # every suggestion in the refusal runs on the same cluster
                suggestions = re.findall(r"RayOptions\(([^)]*)\)", str(error))
                assert suggestions, str(error)
                for suggestion in suggestions:
                    changed = dict(workers=workers, cpus_per_worker=cpus_per_worker)
                    for setting in suggestion.split(", "):
                        name, value = setting.split("=")
                        changed[name] = int(value) if name == "workers" else float(value)
                    _plans_leave_decoding_cpu(cluster, RayOptions(**changed))


def test_workers_that_take_every_cpu_are_refused_with_what_would_run(ray_cluster, model_dir, tmp_path):
    """The hang of `--workers 2` on a 2-CPU cluster (both actors at 1 CPU, decoding at 0) is a
    refusal on the CLI that names the flags that run, before any actor starts."""
    from typer.testing import CliRunner

    from faste_mm.cli.app import app

    folder = tmp_path / "imgs"
    folder.mkdir()
    noise_image(folder / "a.png", (32, 32), 1)
    result = CliRunner().invoke(app, ["index", str(folder), "-c", str(tmp_path / "col"), "--model",
                                      str(model_dir), "--ray", "auto", "--workers", "2"])
    assert result.exit_code == 1, result.output
    assert ("2 workers x 1 CPU leaves no CPU for decoding on this 2-CPU Ray cluster; use --workers 1 or "
            "--cpus-per-worker 0.5") in result.stderr
    assert "RayOptions" not in result.stderr and "Traceback" not in result.stderr


def test_a_default_actor_count_that_takes_every_cpu_is_lowered_with_a_note():
    plan = plan_resources(RayOptions(gpus_per_worker=1.0), {"CPU": 4.0, "GPU": 4.0})  # 4 GPU actors x 1 CPU
    assert (plan.workers, plan.decode_cpus) == (3, 1.0)
    assert "3 embedding actors instead of 4" in plan.note
    plan = plan_resources(RayOptions(workers=1, cpus_per_worker=1.5), {"CPU": 2.0})
    assert (plan.workers, plan.decode_cpus) == (1, 0.5) and "decoding tasks get 0.5 CPU" in plan.note


def test_a_stalled_run_says_what_waits_for_what_once_per_stall(caplog):
    """The stall seen on a 2-CPU cluster (2 actors x 1 CPU, decoding needs 1), replayed with a
    clock the test moves: nothing said before the threshold or while CPU is free."""
    from faste_mm.scale.resources import ResourcePlan, StallWatch, describe_wait

    stuck = ResourcePlan(workers=2, gpus_per_worker=0.0, cpus_per_worker=1.0, decode_cpus=1.0, cluster_cpus=2.0,
                         cluster_gpus=0.0)
    now, free = [0.0], [{"CPU": 0.0}]
    watch = StallWatch(lambda: describe_wait(stuck, free[0]), after_s=120, clock=lambda: now[0])
    now[0] = 119.0
    assert watch.check() is None
    free[0] = {"CPU": 1.0}
    now[0] = 500.0
    assert watch.check() is None  # slow, not stuck: decoding could start now
    free[0] = {"CPU": 0.0}
    with caplog.at_level(logging.WARNING, logger="faste_mm.scale.resources"):
        said = watch.check()
    assert said is not None and said in caplog.text
    assert "no result for 500 s" in said
    assert "decoding tasks wait for 1 CPU each and Ray has 0 of 2 CPU free (2 embedding actors hold 1 CPU each)" in said
    assert watch.check() is None  # said once per stall
    watch.progressed()
    now[0] = 700.0
    assert watch.check() is not None  # a new stall is said again
