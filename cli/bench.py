"""`faste-mm bench [SUITE]`: the one benchmark entry point (faste_mm.bench). Every suite, the model
suite among them, is a subcommand whose arguments go to its own parser (`faste_mm.bench.entry`,
options from faste_mm.bench.options); arguments without a suite go to the model suite
(`faste-mm bench --shape ...` is `faste-mm bench model --shape ...`). All write one schema."""

from __future__ import annotations

import typer
from typer.core import TyperGroup

HELP = ("Measure speed: the model suite (FastE against the full forward; `faste-mm bench model --help` for its "
        "options, which `faste-mm bench` also takes without the word model), or one of the suites below "
        "(`faste-mm bench SUITE --help`). Every suite writes the result schema of faste_mm.bench.schema.")


def with_suite(args: list[str]) -> list[str]:
    """The arguments as a suite's: unchanged when they start with a suite's name or ask for the
    group's --help, else the model suite's."""
    from faste_mm.bench import SUITES

    if args[:1] == ["--help"] or (args and args[0] in SUITES):
        return args
    return ["model", *args]


class BenchGroup(TyperGroup):
    """`faste-mm bench`'s group: arguments without a suite go to the model suite (`with_suite`)."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        return super().parse_args(ctx, with_suite(args))


def _suite_command(suite: str):
    """A subcommand that hands its arguments, unparsed, to the suite's own parser; the model
    suite's progress (model loading, each setting's runs) is drawn on stderr."""
    def command(ctx: typer.Context) -> None:
        from faste_mm.bench.entry import run_suite
        from faste_mm.cli.progress import Progress

        run_suite(suite, list(ctx.args), prog=ctx.command_path, progress=Progress)
    return command


def bench_app() -> typer.Typer:
    """`faste-mm bench`: each suite a subcommand (`model` too, also run without its name)."""
    from faste_mm.bench import SUITES

    group = typer.Typer(add_completion=False, cls=BenchGroup, help=HELP)
    passthrough = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}
    for suite, (_, summary) in SUITES.items():
        group.command(suite, help=summary + " (--help: its options).", context_settings=passthrough,
                      add_help_option=False)(_suite_command(suite))
    return group
