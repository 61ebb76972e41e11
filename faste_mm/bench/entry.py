"""Run one benchmark suite from its command-line arguments: parse them (the suite's options plus
--out and --format), record the start (`schema.start`), run it, wrap what it measured into the
one schema (`schema.finish`) and hand it on: JSON to --out, a table or the JSON on stdout, one
line of machine facts on stderr. `faste-mm bench SUITE` and `python -m faste_mm.bench SUITE` end here.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import logging
import sys
from pathlib import Path

from faste_mm.bench import SUITES
from faste_mm.bench.options import add_output, resolve_device
from faste_mm.bench.schema import BenchResult, describe, finish, start
from faste_mm.errors import ConfigError, FasteError


def parser_for(suite: str, prog: str) -> argparse.ArgumentParser:
    """The suite's parser: its own options, then --out, --format and --debug (every suite's)."""
    module = importlib.import_module(SUITES[suite][0])
    parser = argparse.ArgumentParser(prog=prog, description=SUITES[suite][1] + ".",
                                     epilog="Writes the result schema of faste_mm.bench.schema (--out, --format json).")
    module.add_arguments(parser)
    add_output(parser)
    return parser


def run_suite(suite: str, argv: list[str], prog: str | None = None, progress=None) -> BenchResult:
    """Parse `argv` for `suite`, run it and report (see the module docstring). Exits 2 on a usage
    error (argparse) and 1 on a FasteError, with the message on stderr (and its traceback with
    --debug). progress: makes a progress view (the CLI's `Progress`), for a suite whose `run` takes one."""
    if suite not in SUITES:
        raise SystemExit(f"unknown suite {suite!r}; suites: {', '.join(SUITES)}")
    parser = parser_for(suite, prog or f"faste-mm bench {suite}")
    args = parser.parse_args(argv)
    resolve_device(args)
    if args.out is not None and not args.out.parent.is_dir():
        parser.error(f"--out {args.out}: folder {args.out.parent} does not exist; create it first")
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO, format="%(message)s", stream=sys.stderr)
    begun = start(argv, prog or f"faste-mm bench {suite}")
    measure = importlib.import_module(SUITES[suite][0]).run
    shown = progress is not None and "progress" in inspect.signature(measure).parameters
    try:
        with progress() if shown else contextlib.nullcontext() as view:
            run = measure(args, view) if shown else measure(args)
        result = finish(suite, begun, run)
        write(result, args.out)
    except FasteError as error:
        if args.debug:
            raise
        sys.stderr.write(f"Error: {error.cli_message()}\n")
        raise SystemExit(1) from None
    if args.output == "json":
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
    else:
        sys.stdout.write(run.text.rstrip() + "\n" if run.text else json.dumps(result.rows, indent=1) + "\n")
    sys.stderr.write(describe(result) + "\n")
    return result


def write(result: BenchResult, out: Path | None) -> None:
    """The result's JSON to `out` (nothing without one); ConfigError when it cannot be written."""
    if out is None:
        return
    try:
        out.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    except OSError as error:
        raise ConfigError(f"--out {out}: cannot write the result ({error}); choose another path") from None
    sys.stderr.write(f"wrote {out}\n")
