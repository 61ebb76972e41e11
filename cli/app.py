"""The faste-mm command line (typer). Each command is thin: options -> config dataclasses ->
library call -> render; each lives in its own module and is registered here.
Results go to stdout (a table, or --json); messages to stderr.
Exit codes: 0 ok, 1 a FasteError (message only, traceback with --debug), 2 usage.
"""

from __future__ import annotations

import re
import shutil
from contextlib import contextmanager

import typer
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from faste_mm.cli.album_command import album_app
from faste_mm.cli.bench import HELP as BENCH_HELP, BenchGroup, bench_app
from faste_mm.cli.calibrate import calibrate_command
from faste_mm.cli.collection_commands import compact_command, info_command, rebuild_index_command, remove_command
from faste_mm.cli.duplicates_command import duplicates_command
from faste_mm.cli.embed import embed
from faste_mm.cli.explain_command import explain_command
from faste_mm.cli.export import export_command
from faste_mm.cli.index_command import index_command
from faste_mm.cli.mcp_command import mcp_command
from faste_mm.cli.eval import eval_command
from faste_mm.cli.plan import plan_command
from faste_mm.cli.rerank import rerank_command
from faste_mm.cli.search_command import search_command
from faste_mm.cli.serve import serve_command
from faste_mm.cli.watch_command import watch_command

# typer's labels for a parameter's type, as `--help` shows them in its type column; a range
# ("int range [x>=1]") gets its type's label: the help text states the range, and a narrow type
# column leaves the help column room for paths and env names at 80 columns.
_TYPE_LABELS = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "path": "PATH", "Path": "PATH",
                "int range": "INTEGER", "float range": "NUMBER"}
_RANGE_RE = re.compile(r"^(int range|float range)\b.*")


def _tidy_help(params: list, ctx) -> None:
    """`--help` that reads cleanly: flags show no `<bool>`, other types plain labels (`INTEGER`,
    `PATH...` for a repeatable path, `table|json` for choices), and an option whose help text
    already states its default gets no second `[default: ...]`."""
    for param in params:
        if getattr(param, "is_flag", False):
            param.metavar = ""
        elif param.metavar is None and hasattr(param, "display_type"):
            label = param.display_type(ctx).strip("<>")
            repeated = label.startswith("list[")
            label = _RANGE_RE.sub(r"\1", label.removeprefix("list[").removesuffix("]"))
            label = _TYPE_LABELS.get(label, label)
            if param.param_type_name == "argument":
                param.metavar = param.name.upper()  # its name column
                # typer's usage line shows a required argument as "{PATHS}...": click's "PATHS..."
                usage = param.name.upper() + ("..." if param.nargs != 1 else "")
                param._usage_display_name = lambda usage=usage if param.required else f"[{usage}]": usage
                # typer shows an argument's type in a column of its own whatever the metavar: this
                # command object is built for this one help page, so blank it here.
                param.display_type_rich = lambda ctx: None
            else:
                param.metavar = label + ("..." if repeated else "")
        if "default" in (getattr(param, "help", None) or "").lower():
            param.show_default = False


# Below this width typer's panels squeeze the help column until paths, hub ids and env names are
# cut with "…"; click's plain layout wraps every word in full instead.
_PANELS_MIN_COLUMNS = 100


@contextmanager
def _help_layout(command, params: list, panels: bool = False):
    """Render one --help: rich panels on a wide terminal, with help texts escaped for the
    duration (rich markup would eat `faste-mm[ray]`'s `[ray]`); click's plain layout on a
    narrow one (wrapped, never cut)."""
    if not panels and shutil.get_terminal_size().columns < _PANELS_MIN_COLUMNS:
        mode, command.rich_markup_mode = command.rich_markup_mode, None
        try:
            yield
        finally:
            command.rich_markup_mode = mode
        return
    objects = [obj for obj in (command, *params) if getattr(obj, "help", None)]
    texts = [obj.help for obj in objects]
    for obj in objects:
        obj.help = escape(obj.help)
    try:
        yield
    finally:
        for obj, text in zip(objects, texts):
            obj.help = text


class _Command(TyperCommand):
    def format_help(self, ctx, formatter) -> None:
        params = self.get_params(ctx)
        _tidy_help(params, ctx)
        with _help_layout(self, params):
            super().format_help(ctx, formatter)


class _Group(TyperGroup):
    """Always rich panels: its help is a short table of commands (and a bare `faste-mm` shows it
    through typer's rich error path, which prints no plain help text)."""

    def format_help(self, ctx, formatter) -> None:
        params = self.get_params(ctx)
        _tidy_help(params, ctx)
        with _help_layout(self, params, panels=True):
            super().format_help(ctx, formatter)


class _BenchGroup(BenchGroup, _Group):
    """`faste-mm bench`: the suites' table, arguments without a suite going to the model suite."""


def _summary(docstring: str | None) -> str:
    """A command's line in the root `--help`: its docstring's first sentence on one line (the whole
    first paragraph, with its hard line breaks, wrapped the command table early)."""
    paragraph = " ".join((docstring or "").strip().split("\n\n")[0].split())
    sentence = re.split(r"(?<=\.)\s(?=[A-Z])", paragraph, maxsplit=1)[0]
    return sentence.rstrip(".")


app = typer.Typer(add_completion=False, no_args_is_help=True, cls=_Group,
                  help="Multimodal retrieval with Qwen3-VL-Embedding and FastE.")


def _print_version(value: bool) -> None:
    if value:
        from faste_mm import __version__

        typer.echo(f"faste-mm {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print the version and exit."),
) -> None:
    """Multimodal retrieval with Qwen3-VL-Embedding and FastE."""


for _name, _command in (("index", index_command), ("search", search_command), ("info", info_command),
                        ("remove", remove_command), ("compact", compact_command),
                        ("rebuild-index", rebuild_index_command), ("export", export_command), ("embed", embed),
                        ("explain", explain_command),
                        ("eval", eval_command), ("calibrate", calibrate_command),
                        ("serve", serve_command), ("mcp", mcp_command), ("plan", plan_command), ("rerank", rerank_command),
                        ("duplicates", duplicates_command), ("watch", watch_command)):
    app.command(_name, cls=_Command, short_help=_summary(_command.__doc__))(_command)
app.add_typer(bench_app(), name="bench", cls=_BenchGroup, help=BENCH_HELP,  # every suite a subcommand, model the default
              short_help="Measure speed: the model suite, or one of faste-mm bench SUITE (peers, rerank, scale, client, ...)")
app.add_typer(album_app(), name="album", cls=_Group,
              short_help="Saved searches that stay current: album add NAME QUERY, list, show, remove, export")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
