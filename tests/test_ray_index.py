"""`index --ray`: one local Ray (2 CPUs, no dashboard) that the killed drivers join by address,
one or two CPU embedding actors, a tiny model on disk.

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
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image
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
from faste_mm.scale.resources import plan_resources  # noqa: E402
from tests.helpers.warm_process import run_cli  # noqa: E402
from tests.helpers.inputs import (CORPUS_EMBEDDED, CORPUS_FAILED, CORPUS_REUSED, make_corpus,  # noqa: E402
                                           noise_image, tiny_vl_dir)
from tests.helpers.bounds import HANG_S  # noqa: E402

PAGE_PIXELS = 64 * 64  # big_corpus's pages and images rendered small: its tests are about commits, not pixels
LONG_PDF, LONG_PDF_PAGES = "zzz_long.pdf", PAGES_PER_PART + 4
# Two actors on two logical CPUs leave room for the decoding tasks.
ACTORS = dict(workers=2, cpus_per_worker=0.5, decode_cpus=0.5, files_per_call=2, files_per_task=2)
# Where the number of actors is not the claim, one: each actor is a process that imports torch and
# loads the model (~7 CPU-seconds here), and one decoding task at a time (one worker process).
ONE_ACTOR = dict(workers=1, cpus_per_worker=1.0, decode_cpus=1.0, files_per_call=2, files_per_task=2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_vl_dir(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("ray-corpus") / "files")


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory) -> Path:
    """The mixed corpus plus 12 more images (enough work left after the first commit to kill
    something mid-run), two copies of files committed in earlier chunks, and, last in the
    walk, a PDF of more than PAGES_PER_PART pages (committed range by range with chunk_pages=8)."""
    from tests.helpers.inputs import pdf_of_sizes

    root = make_corpus(tmp_path_factory.mktemp("ray-big") / "files")
    for i in range(12):
        noise_image(root / f"extra{i:02d}.png", (48 + i, 40), 100 + i)
    # Copies far from their originals (other chunks): one of a good image, reused from the stored
    # vector, and one of a bad file, embedded (and failed) again, as a plain run does.
    (root / "zz_gray_again.jpg").write_bytes((root / "gray.jpg").read_bytes())
    (root / "zz_empty_again.jpg").write_bytes(b"")
    pdf_of_sizes(root / LONG_PDF, [(200, 300), (300, 200)] * (LONG_PDF_PAGES // 2), marks=1)
    return root


@pytest.fixture(scope="module")
def plain_big(model_dir, big_corpus, tmp_path_factory):
    """The single-process reference for big_corpus (r_max=0, default batching, pages and images
    at PAGE_PIXELS), indexed once for the tests that compare a Ray run with it (they only read
    it): (report, collection)."""
    collection = tmp_path_factory.mktemp("ray-big-plain") / "plain"
    return _index(model_dir, big_corpus, collection, 0.0, max_pixels=PAGE_PIXELS), collection


def _spec(model_dir: Path, max_batch_size: int = 64) -> ModelSpec:
    return ModelSpec(str(model_dir), device="cpu", batching=BatchingConfig(max_batch_size=max_batch_size))


def _index(model_dir, root, collection, r_max, ray_options=None, max_batch_size=64, progress=None, video=None,
           max_pixels=None, chunk_pages=None, patch_dedup=None):
    options = IndexOptions(chunk_files=3, **({} if chunk_pages is None else {"chunk_pages": chunk_pages}))
    with Retriever(_spec(model_dir, max_batch_size), collection=collection, r_max=r_max, video=video,
                   max_pixels=max_pixels, patch_dedup=patch_dedup) as retriever:
        return retriever.index([root], options=options, progress=progress,
                               executor=None if ray_options is None else RayExecutor(ray_options))


def _rows(collection: Path) -> tuple[dict[tuple[str, int | None], np.ndarray], list[tuple]]:
    """Live (uri, page) -> vector (asserting each once), and the failure rows (uri, page, error)."""
    with Collection.open(collection) as col:
        ids = sorted(col.live_ids(range(10_000)))
        records = col.get(ids)
        vectors = col.vectors(ids)
        failures = sorted((r.uri, r.page, r.error) for r in col.info().failures)
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


@ray.remote(num_cpus=0)
class _Registry:
    """Collects the handles of the embedding actors (ACTOR_REGISTRY_ENV test hook) and kills the
    actor that makes the second call of the run, at its start, once: that call is then in flight
    and the first one's results are delivered."""

    def __init__(self) -> None:
        self.handles, self.calls, self.killed = [], 0, False

    async def add(self, handle) -> None:
        self.handles.append(handle)

    async def calling(self, handle) -> None:
        self.calls += 1
        if self.calls == 2:
            ray.kill(handle, no_restart=False)  # the caller waits for this reply: it dies mid-call
            self.killed = True

    async def seen(self) -> tuple[int, bool]:
        return len(self.handles), self.killed


def test_ray_index_with_faste_and_video_settings_matches_plain_index(ray_cluster, model_dir, corpus, tmp_path,
                                                                    monkeypatch):
    """FastE (r_max > 0) on two actors, with bytes shipped through the object store (a video's
    as a file the actor writes and reads itself). The Ray executor decodes each kind with the
    plain path's decoder and its workers sample videos with the collection's video settings (it
    once recorded every video as an unreadable image) and resize images with its pixel budget
    (`index --ray --max-pixels`): rows, failures and vectors equal a plain run's, and the manifest
    records both. An embedding actor killed in the middle of a call is restarted and the call
    retried: nothing lost or stored twice (each Ray run starts its actors, ~7 CPU-seconds each
    here, so this run carries the kill rather than a run of its own)."""
    from tests.helpers.inputs import write_video

    folder = tmp_path / "files"
    shutil.copytree(corpus, folder)
    write_video(folder / "clip.mp4", 1, 8)
    (folder / "broken.webm").write_bytes(b"not a video")
    noise_image(folder / "photo.png", (320, 256), 3)  # 81,920 px: the budget below shrinks it
    page = np.full((128, 256, 3), 255, dtype=np.uint8)  # a page: white margins around a block of "text"
    page[32:64, 64:128] = np.random.default_rng(5).integers(0, 256, (32, 64, 3), dtype=np.uint8)
    Image.fromarray(page).save(folder / "page.png")
    noise_image(folder / "snapshot.jpg", (128, 64), 4)  # a photo: never deduplicated, even in memory
    video = {"fps": 4.0, "max_frames": 6}  # not the defaults: the workers must get them
    budget = 32 * 32 * 32  # 32 visual tokens: the page keeps its size, its white units repeat
    r_max, max_batch_size = 0.5, 1  # one item per batch: FastE triggers per item in both runs
    settings = dict(max_batch_size=max_batch_size, video=video, max_pixels=budget, patch_dedup="exact")
    plain = _index(model_dir, folder, tmp_path / "plain", r_max, **settings)
    seen = []
    registry = _Registry.options(name="faste-mm-test-registry").remote()
    monkeypatch.setenv(ACTOR_REGISTRY_ENV, "faste-mm-test-registry")
    report = _index(model_dir, folder, tmp_path / "ray", r_max, RayOptions(**ACTORS, ship_bytes=True),
                    progress=seen.append, **settings)
    registered, killed = ray.get(registry.seen.remote())
    assert killed, "no actor was killed mid-call"
    assert registered > ACTORS["workers"], "the killed actor did not restart"
    ray.kill(registry)
    monkeypatch.delenv(ACTOR_REGISTRY_ENV)
    # the corpus, plus the photo, the page, the snapshot and the video, plus the broken video's failure
    expected = (CORPUS_EMBEDDED + 4, CORPUS_REUSED, CORPUS_FAILED + 1)
    assert (report.embedded, report.reused, report.failed) == (plain.embedded, plain.reused, plain.failed) == expected
    assert sorted(f.to_dict().items() for f in report.failures) == sorted(f.to_dict().items() for f in plain.failures)
    assert (report.prefix_tokens, report.kept_prefix_tokens) == (plain.prefix_tokens, plain.kept_prefix_tokens)
    # duplicate-patch removal (the page's repeated white units) on the same items as the plain run
    assert report.patches_kept == plain.patches_kept and plain.patches_kept is not None and plain.patches_kept < 1
    _assert_same_collection(tmp_path / "plain", tmp_path / "ray")
    assert seen[-1].files_done == seen[-1].files_total == plain.files_scanned
    assert [p.files_done for p in seen] == sorted(p.files_done for p in seen)
    with Collection.open(tmp_path / "ray") as col:
        profile = CollectionProfile.from_manifest(col.manifest)
        assert (profile.video.max_frames, profile.max_pixels, profile.patch_dedup) == (6, budget, "exact")
    # A second run finds nothing to do, as a plain one would.
    again = _index(model_dir, folder, tmp_path / "ray", r_max, RayOptions(**ACTORS), **settings)
    assert (again.embedded, again.reused, again.unchanged) == (0, 0, plain.files_scanned)
    # the budget changed the photo's vector (a worker ignoring it would have matched this run)
    alone = tmp_path / "photo-alone"
    alone.mkdir()
    shutil.copy(folder / "photo.png", alone / "photo.png")
    assert _index(model_dir, alone, tmp_path / "full", r_max, max_batch_size=max_batch_size).embedded == 1
    (full_vector,) = _rows(tmp_path / "full")[0].values()
    assert not np.allclose(full_vector, _rows(tmp_path / "ray")[0][(str(folder / "photo.png"), None)], atol=1e-3)


def test_a_shipped_video_is_written_where_the_actor_embeds_it(tmp_path):
    item = embedder_input(Decoded(None, ShippedFile("clip.mp4", b"bytes of a video")), tmp_path / "0")
    assert item.video == tmp_path / "0" / "clip.mp4" and item.video.read_bytes() == b"bytes of a video"


# Ray's C++ log line format ("[2026-11-27 00:42:33,293 E 17483 17483] core_worker.cc:2465: ...")
_RAY_CPP_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+ [DIWEF] \d+ \d+\] \S+:\d+: ", re.MULTILINE)


def _killed_driver(model_dir: Path, folder: Path, collection: Path, address: str, crash_at: str, *flags: str):
    """`faste-mm index --ray ADDRESS` in a process of its own (joining the tests' Ray) that
    SIGKILLs itself at the crash point `crash_at`; returns its stderr. The process is forked from
    a warm one (tests/helpers/warm_process.py; it has not imported Ray): the driver joins Ray and
    is killed as a fresh interpreter would be, without ~6 CPU-seconds of imports first."""
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    env[CRASH_ENV] = crash_at
    proc = run_cli(["index", folder, "-c", collection, "--model", model_dir, "--device", "cpu", "--r-max", "0",
                    "--chunk-files", "2", "--chunk-pages", "8", "--max-pixels", PAGE_PIXELS, "--ray", address,
                    "--workers", "1", *flags], env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    return proc.stderr


def test_sigkilled_drivers_resume_without_embedding_twice_and_a_pdf_mid_file(ray_cluster, model_dir, big_corpus,
                                                                            plain_big, tmp_path):
    """A driver SIGKILLs itself right after its second chunk commit (a named crash point, no
    polling); a second one, resuming, after the first page range of the long PDF (committed range
    by range as its parts come back); a last run (bytes shipped from the driver's node) embeds
    only what is missing, the PDF's pages after that range only. The result equals a plain run's."""
    collection = tmp_path / "ray"
    stderr = _killed_driver(model_dir, big_corpus, collection, ray_cluster, "add-after-commit#2")
    # Ray's own output stays off the terminal without --debug (no execution banner, no actor logs)
    assert "Traceback" not in stderr and "streaming_executor" not in stderr, stderr[-3000:]
    # nor the warnings of Ray's Python loggers ("2026-... WARNING file.py:85 -- Token authentication ...")
    assert not re.search(r"^\d{4}-\d\d-\d\d [\d:,]+\s+(WARNING|INFO) ", stderr, re.MULTILINE), stderr[-3000:]
    # nor its core worker's C++ log lines ("... E ...] core_worker.cc:2465: Actor with class name ...")
    assert not _RAY_CPP_LINE.search(stderr), stderr[-3000:]
    first, _ = _rows(collection)
    assert 0 < len(first)
    assert not [key for key in first if key[0].endswith(LONG_PDF)]  # last in the walk: not reached yet

    stderr = _killed_driver(model_dir, big_corpus, collection, ray_cluster, "index-after-page-range", "--debug")
    assert _RAY_CPP_LINE.search(stderr), stderr[-3000:]  # --debug shows Ray's own lines
    second, _ = _rows(collection)
    committed = sorted(page for uri, page in second if uri.endswith(LONG_PDF))
    assert committed == list(range(1, PAGES_PER_PART + 1))  # the first part, one range (>= 8 pages)
    assert set(first) <= set(second)

    # the rest of the PDF read on the driver's node and shipped through the object store
    again = _index(model_dir, big_corpus, collection, 0.0, RayOptions(**ONE_ACTOR, ship_bytes=True),
                   max_pixels=PAGE_PIXELS, chunk_pages=8)
    plain, plain_collection = plain_big
    assert len(second) + again.embedded + again.reused == plain.embedded + plain.reused  # nothing embedded twice
    assert again.embedded < plain.embedded
    _assert_same_collection(plain_collection, collection)
    resumed_pages = sorted(page for uri, page in set(_rows(collection)[0]) - set(second) if uri.endswith(LONG_PDF))
    assert resumed_pages == list(range(PAGES_PER_PART + 1, LONG_PDF_PAGES + 1))  # only the pages after it
    with Collection.open(collection) as col:  # every row of the file now carries its stat
        records = col.get(sorted(col.live_ids(range(10_000))))
    assert {r.mtime for r in records if r.uri.endswith(LONG_PDF)} == {(big_corpus / LONG_PDF).stat().st_mtime}


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


def test_a_decoding_task_that_meets_a_bad_file_does_not_import_the_model(tmp_path):
    """Each decoding worker is a process of its own: wording a bad file's failure once imported
    torch and transformers there (seconds of CPU and ~0.5 GiB per worker)."""
    (tmp_path / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    code = ("import sys; from faste_mm.retrieval.profile import CollectionProfile; "
            "from faste_mm.scale.ray_workers import FileTask, decode_file_parts; "
            f"[(rows, _)] = decode_file_parts(FileTask({str(tmp_path / 'corrupt.png')!r}, 'image', None), "
            "CollectionProfile(), None, driver_node=''); "
            "print(rows[0].reason); print(sorted({'torch', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=HANG_S).stdout
    assert "corrupt.png: not a readable image" in out and out.endswith("[]\n"), out


def test_rays_cpp_log_lines_are_dropped_and_everything_else_passes(capfd):
    """The filter `index --ray` runs under without --debug, on what reaches fd 2: whole lines in
    Ray's C++ log format go, other lines and a partial line (a prompt, a progress line) pass."""
    from faste_mm.scale.ray_stderr import hidden_cpp_log_lines

    ray_line = (b"[2026-11-27 00:42:33,293 E 17483 17483] core_worker.cc:2465: Actor with class name: "
                b"'MapWorker(MapBatches(EmbedActor))' has constructor arguments in the object store\n")
    with hidden_cpp_log_lines():
        os.write(2, b"before\n" + ray_line[:30])
        os.write(2, ray_line[30:] + b"[not ray] kept\nindexing: 2/25")
    assert capfd.readouterr().err == "before\n[not ray] kept\nindexing: 2/25"
    os.write(2, ray_line)  # after the run: fd 2 is the terminal again
    assert capfd.readouterr().err == ray_line.decode()


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
