"""Values a user can type never end in a traceback or in the library's words: every numeric flag
of every command, given an out-of-range value, is refused with a message naming the flag (the
typer app's own parameters are swept, so a new flag is covered without listing it); a metadata
integer outside SQLite's 64-bit range and a calibrations file that is not an object are named.
No model is needed: each refusal comes before anything loads."""

from __future__ import annotations

import json
import logging
import re
import typing

import pytest
import typer
from typer.testing import CliRunner

from faste_mm.cli.app import app
from faste_mm.errors import ConfigError
from faste_mm.indexers import Collection, ItemRecord, Manifest, SearchFilter

runner = CliRunner()


def _numeric_options():
    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        for param in command.params:
            annotation = param.type_descriptor.annotation
            if typing.get_origin(annotation) is typing.Union:  # Optional[int]
                annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
            if param.param_type_name == "option" and annotation in (int, float):
                yield name, param.opts[0]


NUMERIC_OPTIONS = sorted(set(_numeric_options()))


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """Arguments each command needs besides the flag under test: inputs that exist, a model and
    data that do not (a refusal must come before they are read)."""
    root = tmp_path_factory.mktemp("flags")
    (root / "docs").mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (root / "docs" / name).write_text(f"text {name}", encoding="utf-8")
    model = ["--model", str(root / "no-model")]
    return {"index": [str(root / "docs"), "-c", str(root / "col"), *model],
            "search": ["q", "-c", str(root / "col")], "remove": ["x", "-c", str(root / "col")],
            "export": ["--out", str(root / "out.jsonl"), "-c", str(root / "col")],
            "embed": [str(root / "docs"), *model], "calibrate": [str(root / "docs"), *model],
            "plan": [str(root / "docs"), *model], "rerank": ["q", str(root / "docs" / "a.txt"), *model],
            "eval": ["mscoco", "--data", str(root / "no-data"), *model], "bench": [*model],
            "serve": ["-c", str(root / "col")]}


def test_the_sweep_finds_the_numeric_flags():
    assert ("index", "--video-max-frames") in NUMERIC_OPTIONS and ("serve", "--port") in NUMERIC_OPTIONS
    assert len(NUMERIC_OPTIONS) >= 30


@pytest.mark.parametrize("command,flag", NUMERIC_OPTIONS)
def test_every_numeric_flag_refuses_an_out_of_range_value_by_its_name(command, flag, setting):
    args = [command, *setting.get(command, []), flag, "-7"]
    if command == "index" and flag in ("--workers", "--gpus-per-worker", "--cpus-per-worker"):
        args += ["--ray", "auto"]
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    output = result.stdout + result.stderr
    assert result.exit_code in (1, 2), output
    assert flag in output, output
    assert "Traceback" not in output and not re.search(r"(Config|Options|Profile)\.", output), output


def test_video_max_frames_0_names_the_flag(setting):
    result = runner.invoke(app, ["index", *setting["index"], "--video-max-frames", "0"], env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert "--video-max-frames must be an int >= 2, got 0" in result.stderr


# ---- typed values: metadata integers, calibrations --------------------------------------------
@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**70, 10**23])
def test_a_metadata_integer_outside_int64_is_refused_naming_the_key_and_the_range(value):
    with pytest.raises(ConfigError) as caught:
        SearchFilter(where={"year": value})
    assert "'year'" in str(caught.value) and str(2**63 - 1) in str(caught.value)
    for edge in (2**63 - 1, -(2**63)):  # the range's ends are fine
        assert SearchFilter(where={"year": edge}).where == {"year": edge}


def test_cli_search_with_a_huge_where_integer_is_an_error_not_a_traceback(tmp_path):
    col = tmp_path / "col"
    with Collection.create(col, Manifest(model_id="tiny-model-never-loaded", dim=4)) as c:
        c.add(__import__("numpy").eye(4, dtype="float32")[:1], [ItemRecord(uri="a", modality="text",
                                                                         metadata={"year": 1})])
    result = runner.invoke(app, ["search", "q", "-c", str(col), "--where", f"year={2**76}"])
    assert result.exit_code == 1, result.output
    assert "'year'" in result.stderr and str(2**63 - 1) in result.stderr
    assert "Traceback" not in result.stderr and "OverflowError" not in result.stderr


@pytest.mark.parametrize("content", ["[1, 2]", "null", "3", '"text"'])
def test_a_calibrations_file_that_is_not_an_object_is_named_and_the_default_is_used(tmp_path, caplog, content):
    from faste_mm.retrieval.calibrations import load_calibration

    path = tmp_path / "calibrations.json"
    path.write_text(content, encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="faste_mm.retrieval.calibrations"):
        assert load_calibration("some/model", None, path) is None
    assert str(path) in caplog.text and "not an object of calibrations" in caplog.text


def test_a_saved_calibration_of_the_wrong_shape_is_named_and_the_default_is_used(tmp_path, caplog):
    from faste_mm.retrieval.calibrations import load_calibration

    path = tmp_path / "calibrations.json"
    path.write_text(json.dumps({"some/model@main": [1, 2]}), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="faste_mm.retrieval.calibrations"):
        assert load_calibration("some/model", None, path) is None
    assert str(path) in caplog.text and "some/model@main" in caplog.text
