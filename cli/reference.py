"""The CLI reference (docs/cli.md), generated from the typer app itself: every command, its usage,
its help text and one row per option (flags, value, default, environment variable, help), so the
manual cannot drift from the commands. tests/test_cli_reference.py checks the committed file.

    python -m faste_mm.cli.reference --write docs/cli.md
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import typer

HEADER = """\
# Command-line reference

Generated from the commands themselves by `python -m faste_mm.cli.reference --write docs/cli.md`
(tests/test_cli_reference.py fails when this file and the commands disagree: run that line after
changing an option). Every option can also come from the environment variable in its row. How the
commands print, report progress and exit: [errors.md](errors.md#output-progress-and-exit-codes).
"""


def _cell(text: str) -> str:
    """One markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _flags(param: Any) -> str:
    names = [*param.opts, *param.secondary_opts]
    return ", ".join(f"`{name}`" for name in names)


_LABELS = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "path": "PATH", "Path": "PATH",
           "int range": "INTEGER", "float range": "NUMBER"}


def _value(param: Any, ctx: Any) -> str:
    """What the option takes, as `--help` labels it: `flag`, `table|json`, `INTEGER`, `TEXT...`."""
    if getattr(param, "is_flag", False):
        return "on/off" if param.secondary_opts else "flag"
    label = param.display_type(ctx).strip("<>")
    repeated = label.startswith("list[") or param.multiple
    label = label.removeprefix("list[").removesuffix("]")
    return _LABELS.get(label, label).replace("|", "\\|") + ("..." if repeated else "")


def _default(param: Any) -> str:
    """The declared default, as written in the code (never one computed from this machine)."""
    default = getattr(param.default, "value", param.default)  # an Enum choice: its value
    if callable(default) or default is None or default == () or default == []:
        return ""
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, (list, tuple)):
        return ", ".join(str(value) for value in default)
    return str(default)


def _envvar(param: Any) -> str:
    envvar = getattr(param, "envvar", None)
    if not envvar:
        return ""
    names = [envvar] if isinstance(envvar, str) else list(envvar)
    return ", ".join(f"`{name}`" for name in names)


def _command_section(path: list[str], command: Any, parent: Any) -> list[str]:
    ctx = command.context_class(command, info_name=path[-1], parent=parent)
    # typer writes an argument without a metavar as "{name}": the reference uses --help's NAME
    usage = re.sub(r"\{(\w+)\}", lambda m: m.group(1).upper(), " ".join(command.collect_usage_pieces(ctx)))
    lines = [f"## `{' '.join(path)}`", ""]
    if command.help:
        lines += [command.help.strip(), ""]
    lines += ["```text", f"{' '.join(path)} {usage}".rstrip(), "```", ""]
    arguments = [p for p in command.get_params(ctx) if p.param_type_name == "argument"]
    options = [p for p in command.get_params(ctx) if p.param_type_name == "option" and p.name != "help" and not p.hidden]
    if arguments:
        lines.append("Arguments: " + ", ".join(
            f"`{p.name.upper()}`" + (" (one or more)" if p.nargs == -1 and p.required else
                                            " (any number)" if p.nargs == -1 else "")
            for p in arguments) + ".")
        lines.append("")
    if options:
        lines += ["| option | value | default | environment | meaning |", "|---|---|---|---|---|"]
        for option in options:
            lines.append(f"| {_flags(option)} | {_value(option, ctx)} | {_cell(_default(option))} "
                         f"| {_envvar(option)} | {_cell(option.help or '')} |")
        lines.append("")
    return lines


def _suite_section(path: list[str], suite: str) -> list[str]:
    """A `faste-mm bench` suite: its argparse options (faste_mm.bench.options), read with no
    FASTE_MM_* variable set so the defaults are the declared ones, never this shell's."""
    import os
    from unittest import mock

    from faste_mm.bench import SUITES
    from faste_mm.bench.entry import parser_for

    with mock.patch.dict(os.environ, {k: v for k, v in os.environ.items() if not k.startswith("FASTE_MM_")}, clear=True):
        parser = parser_for(suite, " ".join(path))
    lines = [f"## `{' '.join(path)}`", "", SUITES[suite][1] + ".", "", "```text", f"{' '.join(path)} [OPTIONS]", "```", "",
             "| option | value | default | environment | meaning |", "|---|---|---|---|---|"]
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        env = re.search(r"env (FASTE_MM_\w+)", action.help or "")  # the help names it; here it has a column
        meaning = re.sub(r" \(env FASTE_MM_\w+\)|; env FASTE_MM_\w+", "", (action.help or "").replace("%%", "%"))
        lines.append(f"| {', '.join(f'`{flag}`' for flag in action.option_strings)} | {_suite_value(action)} "
                     f"| {_cell(_default(_Declared(action.default)))} | {f'`{env.group(1)}`' if env else ''} "
                     f"| {_cell(meaning)} |")
    return lines + [""]


class _Declared:
    """An argparse default in the shape `_default` reads (a click parameter's `.default`)."""

    def __init__(self, default: Any) -> None:
        self.default = default


def _suite_value(action: Any) -> str:
    if action.nargs == 0:
        return "flag"
    if action.choices:
        return "\\|".join(action.choices)
    label = _LABELS.get(getattr(action.type, "__name__", "str"), "TEXT")
    return label + ("..." if action.nargs in ("+", "*") else "")


def _walk(path: list[str], command: Any, parent: Any) -> list[str]:
    if path[:2] == ["faste-mm", "bench"] and len(path) == 3:  # a suite: its own parser's options
        return _suite_section(path, path[2])
    if not hasattr(command, "list_commands"):  # typer vendors click: duck-typed
        return _command_section(path, command, parent)
    ctx = command.context_class(command, info_name=path[-1], parent=parent)
    lines: list[str] = []
    if parent is not None:  # a command group below the root: its own heading, then its commands
        lines += [f"## `{' '.join(path)}`", "", (command.help or "").strip(), ""]
    for name in command.list_commands(ctx):
        sub = command.get_command(ctx, name)
        if sub is not None and not sub.hidden:
            lines += _walk([*path, name], sub, ctx)
    return lines


def render() -> str:
    """docs/cli.md's text for the app as it is now."""
    from faste_mm.cli.app import app

    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="faste-mm")
    names = [name for name in root.list_commands(ctx) if not root.get_command(ctx, name).hidden]
    lines = [HEADER, "Commands: " + ", ".join(f"[`{name}`](#faste-mm-{name})" for name in names) + ".", ""]
    lines += _walk(["faste-mm"], root, None)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if args[:1] == ["--write"] and len(args) == 2:
        Path(args[1]).write_text(text, encoding="utf-8")
    elif not args:
        sys.stdout.write(text)
    else:
        sys.stderr.write("usage: python -m faste_mm.cli.reference [--write FILE]\n")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
