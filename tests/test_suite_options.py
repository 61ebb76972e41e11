"""One option system for every `faste-mm bench` suite (issue 45 item 7): every suite's parser comes
from faste_mm/bench/options.py, takes --out and --format, and a suite that runs a model takes
--device (and --dtype) with the words, the "auto" default and the environment variables of the
model suite and of every other faste-mm command. Parsing and --help only: no suite runs here."""

from __future__ import annotations

import argparse
import typing

import pytest
import typer
from typer.testing import CliRunner

from faste_mm.bench import SUITES
from faste_mm.bench.entry import parser_for
from faste_mm.bench.options import resolve_device
from faste_mm.cli.app import app
from faste_mm.model.cpu.machine import DEVICE_CHOICES, DTYPE_CHOICES

SUITE_NAMES = [name for name in SUITES if name != "model"]  # the model suite is the CLI's own command


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


def _model_suite_option(flag: str):
    group = typer.main.get_command(app).commands["bench"]
    return next(p for p in group.commands["model"].params if flag in getattr(p, "opts", ()))


@pytest.mark.parametrize("suite", SUITE_NAMES)
def test_every_suite_takes_out_format_and_the_one_device_and_dtype(suite, monkeypatch):
    monkeypatch.delenv("FASTE_MM_DEVICE", raising=False)
    monkeypatch.delenv("FASTE_MM_DTYPE", raising=False)
    options = _options(parser_for(suite, f"faste-mm bench {suite}"))
    assert {"--out", "--format"} <= set(options)
    if "--device" in options:
        assert options["--device"].default == "auto" and DEVICE_CHOICES in options["--device"].help
    if "--dtype" in options:
        assert DTYPE_CHOICES in options["--dtype"].help


def test_the_model_suite_and_the_others_say_device_and_dtype_alike():
    device, dtype = _model_suite_option("--device"), _model_suite_option("--dtype")
    assert device.default == "auto" and device.help == f"{DEVICE_CHOICES}. Default auto."
    assert DTYPE_CHOICES in dtype.help and (device.envvar, dtype.envvar) == ("FASTE_MM_DEVICE", "FASTE_MM_DTYPE")
    suites_with_device = [s for s in SUITE_NAMES if "--device" in _options(parser_for(s, s))]
    assert {"peers", "rerank", "rerank-e2e", "ray", "batch-tokens", "rerank-warm", "tower-attention"} <= set(suites_with_device)


def test_the_environment_sets_a_suites_device_dtype_and_out_like_the_cli(monkeypatch, tmp_path):
    monkeypatch.setenv("FASTE_MM_DEVICE", "cpu")
    monkeypatch.setenv("FASTE_MM_DTYPE", "float32")
    monkeypatch.setenv("FASTE_MM_BENCH_OUT", str(tmp_path / "r.json"))
    args = parser_for("rerank", "faste-mm bench rerank").parse_args([])
    assert (args.device, args.dtype, args.out) == ("cpu", "float32", tmp_path / "r.json")
    given = parser_for("rerank", "faste-mm bench rerank").parse_args(["--device", "cuda:1", "--dtype", "bfloat16"])
    assert (given.device, given.dtype) == ("cuda:1", "bfloat16")
    assert parser_for("rerank-e2e", "x").parse_args([]).dtype == "float32"  # the variable over a suite's own default


def test_the_entry_point_resolves_auto_as_every_command_does():
    import torch

    args = argparse.Namespace(device="auto")
    resolve_device(args)
    assert args.device == ("cuda" if torch.cuda.is_available() else "cpu")
    given = argparse.Namespace(device="cpu")
    resolve_device(given)
    assert given.device == "cpu"
    resolve_device(argparse.Namespace())  # a suite without --device: nothing to resolve


@pytest.mark.parametrize("suite", ["rerank-e2e", "peers", "startup"])
def test_suite_help_goes_through_the_one_entry_point(suite):
    shown = CliRunner().invoke(app, ["bench", suite, "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "--out" in shown.stdout and "--format" in shown.stdout
    assert ("Default auto" in shown.stdout) == (suite != "startup")  # startup runs no model


def test_the_model_suite_shares_the_suites_words_for_inputs_and_out():
    from faste_mm.bench.options import INPUTS_WORDS, OUT_HELP

    assert INPUTS_WORDS in _model_suite_option("--inputs").help
    assert OUT_HELP[1:] in _model_suite_option("--out").help
    assert INPUTS_WORDS in _options(parser_for("rerank", "x"))["--inputs"].help


def test_help_strings_are_the_declared_ones_not_copies():
    """The CLI's --device and --dtype help come from machine.py's words (one declaration)."""
    from faste_mm.cli.options import Device, Dtype

    assert typing.get_args(Device)[1].help == f"{DEVICE_CHOICES}. Default auto."
    assert typing.get_args(Dtype)[1].help == f"Model weights and compute: {DTYPE_CHOICES}. Default auto."
