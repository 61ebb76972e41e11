"""One option system for every `faste-mm bench` suite (issue 45 item 7): every suite's parser, the
model suite's too, comes from faste_mm/bench/options.py, takes --out, --format and --debug, and a
suite that runs a model takes --device (and --dtype) with the words, the "auto" default and the
environment variables of every other faste-mm command. Parsing and --help only: no suite runs here."""

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
from faste_mm.model.cpu.machine import BATCH_TOKENS_DEFAULT, DEVICE_CHOICES, DTYPE_CHOICES, UNPADDED_CHOICES

SUITE_NAMES = list(SUITES)


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


def _model_suite_option(flag: str) -> argparse.Action:
    return _options(parser_for("model", "faste-mm bench model"))[flag]


@pytest.mark.parametrize("suite", SUITE_NAMES)
def test_every_suite_takes_out_format_and_the_one_device_and_dtype(suite, monkeypatch):
    monkeypatch.delenv("FASTE_MM_DEVICE", raising=False)
    monkeypatch.delenv("FASTE_MM_DTYPE", raising=False)
    options = _options(parser_for(suite, f"faste-mm bench {suite}"))
    assert {"--out", "--format", "--debug"} <= set(options)
    if "--device" in options:
        assert options["--device"].default == "auto" and DEVICE_CHOICES in options["--device"].help
    if "--dtype" in options:
        assert DTYPE_CHOICES in options["--dtype"].help


def test_the_model_suite_and_the_others_say_device_and_dtype_alike(monkeypatch):
    monkeypatch.delenv("FASTE_MM_DEVICE", raising=False)
    device, dtype = _model_suite_option("--device"), _model_suite_option("--dtype")
    assert device.default == "auto" and device.help == _options(parser_for("peers", "x"))["--device"].help
    assert DTYPE_CHOICES in dtype.help and "FASTE_MM_DTYPE" in dtype.help
    suites_with_device = [s for s in SUITE_NAMES if "--device" in _options(parser_for(s, s))]
    assert {"model", "peers", "rerank", "rerank-e2e", "ray", "batch-tokens", "rerank-warm", "tower-attention"} <= set(suites_with_device)


# The model suite's options that every faste-mm command embedding with a model also takes, and
# their variables: declared once (the collection settings' flags, machine.py's words).
SHARED_WITH_THE_CLI = {"--r-max": "FASTE_MM_R_MAX", "--warmup-layer": "FASTE_MM_WARMUP_LAYER",
                       "--threshold": "FASTE_MM_THRESHOLD", "--trigger-layer": "FASTE_MM_TRIGGER_LAYER",
                       "--patch-dedup": "FASTE_MM_PATCH_DEDUP", "--batch-tokens": "FASTE_MM_BATCH_TOKENS",
                       "--unpadded": "FASTE_MM_UNPADDED", "--device": "FASTE_MM_DEVICE", "--dtype": "FASTE_MM_DTYPE"}


@pytest.mark.parametrize("flag, env", sorted(SHARED_WITH_THE_CLI.items()))
def test_the_model_suite_takes_the_clis_fast_e_and_batching_options_with_their_words(flag, env, monkeypatch):
    monkeypatch.delenv(env, raising=False)
    embed = {opt: p for p in typer.main.get_command(app).commands["embed"].params
             if p.param_type_name == "option" for opt in p.opts}
    ours = _model_suite_option(flag)
    assert embed[flag].envvar == env and env in ours.help
    words = {"--batch-tokens": BATCH_TOKENS_DEFAULT, "--unpadded": UNPADDED_CHOICES, "--device": DEVICE_CHOICES,
             "--dtype": DTYPE_CHOICES}.get(flag, embed[flag].help)  # the setting flags: their whole declared help
    assert words in embed[flag].help and words in ours.help, flag
    monkeypatch.setenv(env, {"--r-max": "0.3,0.5", "--patch-dedup": "exact", "--threshold": "0.5"}.get(flag, "2"))
    given = getattr(parser_for("model", "x").parse_args([]), ours.dest)
    assert given not in (None, "auto"), f"{env} does not set {flag}"


def test_the_model_suite_checks_ranges_by_flag_before_anything_runs(capsys):
    parser = parser_for("model", "faste-mm bench model")
    for args, flag in ((["--r-max", "0.5,1.2"], "--r-max"), (["--threshold", "2"], "--threshold"),
                       (["--n", "0"], "--n"), (["--warmup-layer", "-1"], "--warmup-layer")):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(args)
        assert exit_.value.code == 2 and flag in capsys.readouterr().err
    assert parser.parse_args(["--r-max", "0,0.5"]).r_max == (0.0, 0.5)


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


@pytest.mark.parametrize("suite", ["rerank-e2e", "peers", "startup", "model"])
def test_suite_help_goes_through_the_one_entry_point(suite):
    shown = CliRunner().invoke(app, ["bench", suite, "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "--out" in shown.stdout and "--format" in shown.stdout
    assert ("Default auto" in shown.stdout) == (suite != "startup")  # startup runs no model


def test_bench_without_a_suite_is_the_model_suite():
    assert CliRunner().invoke(app, ["bench", "--shape", "--help"]).exit_code == 2  # the model suite's parser refused it
    shown = CliRunner().invoke(app, ["bench", "--n", "2", "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "bench model [-h]" in shown.stdout and "--scale-hidden" in shown.stdout
    listed = CliRunner().invoke(app, ["bench", "--help"])
    assert listed.exit_code == 0 and "model" in listed.stdout and "peers" in listed.stdout


def test_the_model_suite_shares_the_suites_words_for_inputs_and_out():
    from faste_mm.bench.options import INPUTS_WORDS, OUT_HELP

    assert INPUTS_WORDS in _model_suite_option("--inputs").help
    assert _model_suite_option("--out").help == _options(parser_for("rerank", "x"))["--out"].help
    assert OUT_HELP in _model_suite_option("--out").help
    assert INPUTS_WORDS in _options(parser_for("rerank", "x"))["--inputs"].help


def test_help_strings_are_the_declared_ones_not_copies():
    """The CLI's --device and --dtype help come from machine.py's words (one declaration)."""
    from faste_mm.cli.options import Device, Dtype

    assert typing.get_args(Device)[1].help == f"{DEVICE_CHOICES}. Default auto."
    assert typing.get_args(Dtype)[1].help == f"Model weights and compute: {DTYPE_CHOICES}. Default auto."
