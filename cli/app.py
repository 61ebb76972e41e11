"""The faste-mm command line (typer). Each command is thin: options -> config dataclasses ->
library call -> render; each lives in its own module and is registered here.
Results go to stdout (a table, or --json); messages to stderr.
Exit codes: 0 ok, 1 a FasteError (message only, traceback with --debug), 2 usage.
"""

from __future__ import annotations

import typer

from faste_mm.cli.bench import bench_command
from faste_mm.cli.calibrate import calibrate_command
from faste_mm.cli.collection_commands import (
    compact_command,
    index_command,
    info_command,
    rebuild_index_command,
    remove_command,
    search_command,
)
from faste_mm.cli.embed import embed
from faste_mm.cli.export import export_command
from faste_mm.cli.eval import eval_command
from faste_mm.cli.serve import serve_command

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Multimodal retrieval with Qwen3-VL-Embedding and FastE.")


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


app.command("index")(index_command)
app.command("search")(search_command)
app.command("info")(info_command)
app.command("remove")(remove_command)
app.command("compact")(compact_command)
app.command("rebuild-index")(rebuild_index_command)
app.command("export")(export_command)
app.command()(embed)
app.command("eval")(eval_command)
app.command("bench")(bench_command)
app.command("calibrate")(calibrate_command)
app.command("serve")(serve_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
