"""The machine plan (faste_mm/model/cpu/machine_plan.py): threads and batch budget from the cores
given (1, 2, 16, 64, a cgroup quota read from fixture files), the user's settings winning, and the
places that read it (BatchingConfig, the embedder's torch threads, the reported settings)."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from faste_mm import BatchingConfig, Embedder
from faste_mm.errors import ConfigError
from faste_mm.model.cpu.machine_plan import (BATCH_TOKENS, MAX_PREP_THREADS, available_cores, cgroup_quota, machine_plan,
                                             use_torch_threads)

NO_ENV: dict[str, str] = {}


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("cores", [1, 2, 16, 64])
def test_plan_follows_the_cores_given(cores):
    plan = machine_plan(cores, env=NO_ENV)
    assert (plan.cores, plan.cores_from, plan.chosen) == (cores, "given", ())
    assert plan.intra_op_threads == cores and plan.interop_threads == 1
    assert plan.prep_threads == min(cores, MAX_PREP_THREADS)
    assert plan.batch_tokens == BATCH_TOKENS["cpu"] and machine_plan(cores, "cuda", env=NO_ENV).batch_tokens == BATCH_TOKENS["cuda"]
    assert f"torch {cores}," in plan.describe() and f"({cores} cores: given)" in plan.describe()


def _cgroup_v2(root, text: str):
    """A cgroup v2 folder whose cpu.max says `text` (quota and period in microseconds)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "cpu.max").write_text(text)
    return root


def test_a_cgroup_quota_of_two_on_a_64_core_host_gives_two(tmp_path):
    root = _cgroup_v2(tmp_path, "200000 100000\n")
    assert cgroup_quota(root) == 2.0
    cores, source = available_cores(affinity=range(64), cgroup=root)
    assert cores == 2 and source == "cgroup quota 2 CPUs of 64"


def test_a_fractional_quota_rounds_up_and_no_quota_keeps_the_affinity(tmp_path):
    assert available_cores(range(64), _cgroup_v2(tmp_path / "a", "150000 100000"))[0] == 2
    assert available_cores(range(64), _cgroup_v2(tmp_path / "b", "max 100000")) == (64, "affinity")
    assert available_cores(range(3), tmp_path / "missing") == (3, "affinity")  # no cgroup files: the mask alone
    assert available_cores(range(2), _cgroup_v2(tmp_path / "c", "800000 100000")) == (2, "affinity")  # quota above it


def test_a_cgroup_v1_quota_is_read_too(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert available_cores(range(64), tmp_path)[0] == 2
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert available_cores(range(64), tmp_path)[0] == 64


def test_the_plan_reads_the_cgroup_when_no_cores_are_given(tmp_path):
    plan = machine_plan(env=NO_ENV, cgroup=_cgroup_v2(tmp_path, "200000 100000"))
    assert plan.cores <= 2 and plan.intra_op_threads == plan.cores and plan.cores_from != "given"


def test_the_users_settings_win():
    plan = machine_plan(16, workers=3, batch_tokens=1024, env={"OMP_NUM_THREADS": "5"})
    assert (plan.intra_op_threads, plan.prep_threads, plan.batch_tokens) == (5, 3, 1024)
    assert plan.chosen == ("OMP_NUM_THREADS=5", "workers=3", "batch_tokens=1024")
    assert "set: OMP_NUM_THREADS=5, workers=3, batch_tokens=1024" in plan.describe()
    assert machine_plan(2, workers=0, env={"MKL_NUM_THREADS": "4,1"}).intra_op_threads == 4
    assert machine_plan(2, workers=0, env=NO_ENV).prep_threads == 0


def test_bad_inputs_name_the_setting():
    with pytest.raises(ConfigError, match="OMP_NUM_THREADS='two'"):
        machine_plan(2, env={"OMP_NUM_THREADS": "two"})
    with pytest.raises(ConfigError, match="cores must be an int >= 1, got 0"):
        machine_plan(0, env=NO_ENV)


def test_batching_resolves_workers_and_tokens_from_the_plan(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    plan = machine_plan()
    resolved = BatchingConfig().for_device(torch.device("cpu"))
    assert (resolved.workers, resolved.batch_tokens) == (plan.prep_threads, plan.batch_tokens)
    assert BatchingConfig().worker_threads == plan.prep_threads  # prefetch's pool without a device
    mine = BatchingConfig(workers=1, batch_tokens=512).for_device(torch.device("cpu"))
    assert (mine.workers, mine.batch_tokens, mine.worker_threads) == (1, 512, 1)


def test_torch_threads_come_down_to_the_plan_and_never_go_up(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    plan = machine_plan(2, env=NO_ENV)
    torch.set_num_threads(6)  # what torch's default says on a 2-CPU container of a 6-core host
    assert use_torch_threads(plan) == 2 == torch.get_num_threads()
    torch.set_num_threads(1)  # a caller's own lower count (a Ray actor's share) stays
    assert use_torch_threads(plan) == 1
    assert use_torch_threads(machine_plan(2, env={"OMP_NUM_THREADS": "3"})) == 3  # the user's variable wins


def test_an_embedder_runs_torch_at_the_plans_threads_and_reports_them(model_dirs, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    plan = machine_plan()
    torch.set_num_threads(plan.intra_op_threads + 3)  # oversubscribed, as torch's default is under a quota
    embedder = Embedder.from_pretrained(str(model_dirs["qwen3_vl"]), device="cpu", dtype="float32")
    assert torch.get_num_threads() == plan.intra_op_threads
    assert embedder.machine == plan and embedder.batching.workers == plan.prep_threads
    assert embedder.encode(["a red bicycle"]).stats.kernels[0] == plan.describe()


def test_the_embed_command_shows_the_plan(model_dirs):
    from faste_mm.cli.app import app

    result = CliRunner().invoke(app, ["embed", "--text", "a red bicycle", "--model", str(model_dirs["qwen3_vl"]),
                                      "--device", "cpu", "--dtype", "float32", "--batch-tokens", "512"])
    assert result.exit_code == 0, result.output
    assert "threads: torch" in result.output and "batch tokens 512" in result.output
