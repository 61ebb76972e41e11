"""Every code block of README.md and docs/*.md runs, so a snippet that drifts from the code turns
the suite red. Shell blocks run in bash through the real `faste-mm` CLI, Python blocks in a
separate process (one session per document: its blocks build on each other), in a fresh sandbox
of generated files per document, with the hub ids replaced by tiny random-weight models. A block
marked `<!-- skip: REASON -->` is reported as skipped with its reason.

Speed: each `faste-mm` command and each page's Python session is forked from the warm process of
tests/helpers/warm_process.py instead of importing torch and transformers again, which would cost
~4 s of CPU per command (FASTE_MM_TEST_FRESH=1: the installed script and python, started fresh).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.docs_blocks import Block, documents, extract, make_sandbox, shell_script, substitute
from tests.helpers.tiny_models import tiny_model_dir
from tests.helpers.warm_process import PIPE, cli_command, start_python

ROOT = Path(__file__).resolve().parents[1]
ALL_BLOCKS = [block for path in documents() for block in extract(path)]
RUNNABLE = sorted({block.path for block in ALL_BLOCKS if block.runs})
SKIPPED = [block for block in ALL_BLOCKS if block.skip is not None]
# hub id -> tiny family standing in for it
STAND_INS = {"Qwen/Qwen3-VL-Embedding-2B": "qwen3_vl", "Qwen/Qwen3-VL-Embedding-8B": "qwen3_vl",
             "Qwen/Qwen3-VL-Reranker-2B": "qwen3_vl_reranker", "Qwen/Qwen3-VL-Reranker-8B": "qwen3_vl_reranker",
             "Qwen/Qwen3-Reranker-0.6B": "qwen3_reranker", "Qwen/Qwen3-Embedding-0.6B": "qwen3"}


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory) -> dict[str, Path]:
    return {hub_id: tiny_model_dir(tmp_path_factory.getbasetemp(), family) for hub_id, family in STAND_INS.items()}


@pytest.fixture(scope="module")
def base_env(tmp_path_factory, stand_ins) -> dict[str, str]:
    """The environment every block runs in: `faste-mm` on PATH is tests/helpers/warm_process.py's
    `cli_command` (a fork of the warm process; the installed script in fresh mode)."""
    shim_dir = tmp_path_factory.mktemp("doc-bin")
    command = cli_command(shim_dir)  # after `stand_ins`: the warm process has their preprocessors loaded
    env = {key: value for key, value in os.environ.items() if not key.startswith(("FASTE_MM_", "COLUMNS", "LINES"))}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1", FASTE_MM_DEVICE="cpu",
               FASTE_MM_MODEL=str(stand_ins["Qwen/Qwen3-VL-Embedding-2B"]),
               PATH=os.pathsep.join([str(Path(command).parent), str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    return env


def _sandbox_env(base: dict[str, str], home: Path) -> dict[str, str]:
    return {**base, "HOME": str(home), "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_CONFIG_HOME": str(home / ".config"), "XDG_CACHE_HOME": str(home / ".cache")}


# A page's Python blocks, run in order in one process sharing one namespace: a block arrives as a
# JSON line on stdin, its answer (None or the traceback) leaves as a JSON line on the process's
# first stdout; the blocks' own output, stdout included, goes to stderr (the page's log).
_SESSION = """
import json, os, sys, traceback
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
namespace = {"__name__": "__main__"}
while line := sys.stdin.readline():
    block = json.loads(line)
    try:
        exec(compile(block["code"], block["label"], "exec"), namespace)
        error = None
    except BaseException:
        error = traceback.format_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    answers.write(json.dumps(error) + "\\n")
    answers.flush()
"""
BLOCK_BOUND_S = 600  # a failure detector for a hung block, not a speed assertion


class _PythonSession:
    """One document's Python blocks, run in order in one process (tests/helpers/warm_process.py)."""

    def __init__(self, env: dict[str, str], cwd: Path, log: Path):
        with open(log, "ab") as out:
            self.process = start_python(_SESSION, env=env, cwd=cwd, stdin=PIPE, stdout=PIPE, stderr=out)

    def run(self, block: Block, code: str) -> str | None:
        """None when the block ran, else the traceback."""
        self.process.stdin.write(json.dumps({"code": code, "label": block.label}) + "\n")
        self.process.stdin.flush()
        if not select.select([self.process.stdout], [], [], BLOCK_BOUND_S)[0]:
            return f"the block did not finish in {BLOCK_BOUND_S} s"
        answer = self.process.stdout.readline()
        return json.loads(answer) if answer else "the Python session died (see its output)"

    def close(self) -> None:
        self.process.stdin.close()  # the session's end of input: it returns
        try:
            self.process.wait(BLOCK_BOUND_S)
        finally:
            self.process.close()


def _failure(block: Block, code: str, detail: str) -> str:
    return f"{block.label}: this {block.tag} block failed\n--- block ---\n{code}--- output ---\n{detail[-4000:]}"


@pytest.mark.parametrize("path", RUNNABLE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_of_the_document_runs(path, base_env, stand_ins, tmp_path):
    home, work = make_sandbox(tmp_path)
    env = _sandbox_env(base_env, home)
    session = None
    try:
        for block in (b for b in extract(path) if b.runs):
            code = substitute(shell_script(block) if block.tag != "python" else block.code, stand_ins)
            if block.tag == "python":
                session = session or _PythonSession(env, work, tmp_path / "python.log")
                error = session.run(block, code)
                if error is not None:
                    output = (tmp_path / "python.log").read_text(errors="replace")
                    pytest.fail(_failure(block, code, f"{output[-2000:]}\n{error}"), pytrace=False)
            else:
                done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=work, env=env, stdin=subprocess.DEVNULL,
                                      capture_output=True, text=True, timeout=600)
                if done.returncode != 0:
                    pytest.fail(_failure(block, code, f"exit {done.returncode}\n{done.stdout[-1500:]}\n{done.stderr}"),
                                pytrace=False)
    finally:
        if session is not None:
            session.close()


@pytest.mark.parametrize("block", SKIPPED, ids=lambda b: b.label)
def test_skipped_block_says_why(block):
    """Each block marked skip appears in the run's summary with its reason."""
    assert block.skip.strip(), f"{block.label}: a skip marker needs a reason"
    pytest.skip(f"{block.label}: {block.skip}")


def test_extract_reads_tags_indented_fences_and_skip_markers(tmp_path):
    doc = ROOT / "docs" / "_probe.md"  # inside the repository: labels are relative to it
    text = ("intro\n\n```bash\nfaste-mm info\n```\n\n<!-- skip: needs CUDA -->\n```python\nimport torch\n```\n"
            "- a list item:\n\n  ```python\n  x = 1\n  ```\n\n```json\n{}\n```\n\n```console\n$ faste-mm info\noutput\n```\n")
    try:
        doc.write_text(text)
        blocks = extract(doc)
    finally:
        doc.unlink()
    assert [(b.tag, b.line, b.skip) for b in blocks] == [
        ("bash", 3, None), ("python", 8, "needs CUDA"), ("python", 13, None), ("json", 17, None), ("console", 21, None)]
    assert blocks[2].code == "x = 1\n" and not blocks[3].runs and not blocks[1].runs
    assert shell_script(blocks[4]) == "faste-mm info\n"
    pip = Block(doc, 1, "bash", "pip install 'faste-mm[serve]'\nfaste-mm serve --help\n", None)
    assert shell_script(pip) == "faste-mm serve --help\n"


def test_hub_ids_are_replaced_by_their_stand_ins():
    models = {"Qwen/Qwen3-VL-Embedding-2B": Path("/m/vl"), "Qwen/Qwen3-VL-Reranker-2B": Path("/m/rr")}
    code = 'Embedder.from_pretrained("Qwen/Qwen3-VL-Embedding-2B", dim=512); --rerank Qwen/Qwen3-VL-Reranker-2B --dim 512'
    assert substitute(code, models) == 'Embedder.from_pretrained("/m/vl", dim=32); --rerank /m/rr --dim 32'


def test_benchmark_pages_skip_their_blocks_as_long_benchmarks(tmp_path):
    doc = ROOT / "docs" / "benchmarks-log.md"
    blocks = [b for b in extract(doc) if b.tag in ("bash", "python")]
    assert blocks and all(b.skip and "long benchmark" in b.skip for b in blocks)


def test_the_sandbox_holds_the_files_the_docs_name(tmp_path):
    home, work = make_sandbox(tmp_path)
    for path in (home / "Pictures", home / "papers" / "report.pdf", work / "photos", work / "query.jpg",
                 work / "report.pdf", work / "clip.mp4"):
        assert path.exists(), path
    assert shutil.which("bash")


def test_readme_is_a_front_page_whose_test_command_is_what_ci_runs():
    """docs/contributing.md "Code style" (Docs): at most 250 lines; its test command is .ci/run's last line, verbatim, after
    the same torch/torchvision pin."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert len(readme.splitlines()) <= 250, f"README.md has {len(readme.splitlines())} lines; move detail to docs/"
    pin = next(line.strip() for line in ci_lines if "pip install" in line and "torch==" in line)
    test_command = next(b.code.strip() for b in extract(ROOT / "README.md") if "pytest" in b.code)
    assert test_command.endswith(ci_lines[-1].strip()), (test_command, ci_lines[-1])
    pinned = pin.split("install -q ")[-1]  # "torch==2.14.1 torchvision==0.29.1"
    assert test_command.startswith(f"pip install {pinned} && "), (test_command, pinned)
