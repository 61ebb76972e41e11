"""The collection settings' command-line flags, made from their declarations (`CollectionProfile`'s
`setting(...)` fields, faste_mm/retrieval/setting.py), so a new setting needs no CLI edit:
`setting_option(flag)` is one flag as a typer option; `@takes_settings(...)` adds the flags of the
chosen settings to a command and hands it their values as one `GivenFlags`; `FLAG_OF_FIELD` names
each profile field by its flag in error messages. Nothing here imports torch or FAISS.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Mapping, Optional, get_type_hints

import typer

from faste_mm.retrieval.profile import CollectionProfile
from faste_mm.retrieval.setting import Flag, Setting, flag_settings, settings_of

SETTINGS = settings_of(CollectionProfile)
FLAGS = {flag.name: flag for declared in SETTINGS.values() for flag in declared.flags}

# A library message names a field (`CollectionProfile.dim`, `VideoConfig.fps`); the user typed a flag.
FLAG_OF_FIELD = {
    **{f"CollectionProfile.{name}": declared.flags[0].name for name, declared in SETTINGS.items()
       if declared.flags and declared.flags[0].part is None},
    **{f"VideoConfig.{flag.part}": flag.name for flag in SETTINGS["video"].flags},
}


def setting_option(flag: Flag | str, parsed_as: type | None = None) -> Any:
    """One declared flag (or its name) as a typer option type: its value type (or `parsed_as`: --r-max
    as text for the sweeps of eval, bench and plan), FASTE_MM_* variable, bounds and help; not given = None."""
    flag = FLAGS[flag] if isinstance(flag, str) else flag
    return Annotated[Optional[parsed_as or flag.type], typer.Option(flag.name, envvar=flag.envvar, help=flag.help, min=flag.min,
                                                       max=flag.max, show_default=False)]


@dataclass(frozen=True, slots=True)
class GivenFlags:
    """The values of a command's setting flags (by parameter name; None = not given)."""

    values: Mapping[str, Any]

    def settings(self) -> dict[str, Any]:
        """The settings given, by profile field (`flag_settings`): ConfigError (in flag words) for
        two flags of one setting, e.g. --max-pixels and --visual-tokens."""
        return flag_settings(CollectionProfile, self.values)

    def given(self) -> list[str]:
        """The flags given, as typed."""
        return [FLAG_BY_PARAM[param].name for param, value in self.values.items() if value is not None]


FLAG_BY_PARAM = {flag.param: flag for flag in FLAGS.values()}


def flags_of(select: Callable[[str, Setting], bool]) -> list[Flag]:
    """The declared flags of the settings `select(name, setting)` keeps, in declaration order."""
    return [flag for name, declared in SETTINGS.items() if select(name, declared) for flag in declared.flags]


def takes_settings(select: Callable[[str, Setting], bool]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A typer command taking the flags of every declared setting `select` keeps: they are added
    to its options (after its own; one the command declares itself keeps the command's), and the
    command receives their values as `settings: GivenFlags`."""

    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "settings"]
        flags = [flag for flag in flags_of(select) if flag.param not in {p.name for p in own}]
        added = [inspect.Parameter(flag.param, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                   annotation=setting_option(flag)) for flag in flags]
        hints = get_type_hints(command, include_extras=True)

        @functools.wraps(command)
        def run(**values: Any) -> Any:
            given = GivenFlags({flag.param: values.pop(flag.param) for flag in flags})
            return command(settings=given, **values)

        run.__signature__ = signature.replace(parameters=[*own, *added])
        run.__annotations__ = {**{p.name: hints[p.name] for p in own if p.name in hints},
                               **{p.name: p.annotation for p in added}}
        run.setting_flags = tuple(flag.name for flag in flags)  # what the walk-every-setting test reads
        return run

    return wrap


def on_index(name: str, declared: Setting) -> bool:
    """`faste-mm index` takes every setting that has flags."""
    return True


def on_serve(name: str, declared: Setting) -> bool:
    """`faste-mm serve` takes the settings vectors depend on (`refuse`): checked against a served
    collection (a different one is refused), applied to an embeddings-only server where they can be."""
    return declared.refuse


def settings_table() -> str:
    """The manual's table of collection settings (docs/collections.md "Settings"), generated from
    the declarations: Python keyword, CLI flags, default, whether a different value is refused,
    and the help line. `python -m faste_mm.cli.setting_flags` prints it."""
    defaults = CollectionProfile()
    rows = ["| setting (Python keyword) | flags (index, serve) | default | on an existing collection | what it is |",
            "|---|---|---|---|---|"]
    for name, declared in SETTINGS.items():
        if not (declared.keyword or declared.flags):
            continue
        keyword = f"`{name}`" if declared.keyword else f"`{name}` (`{'model' if name == 'model_id' else 'revision'}=`)"
        flags = ", ".join(f"`{flag.name}`" for flag in declared.flags) or f"`{declared.flag}` (index)"
        if declared.flags and not on_serve(name, declared):
            flags += " (index only)"
        default = getattr(defaults, name)
        shown = "the defaults of VideoConfig" if name == "video" else "none" if default is None else f"`{default}`"
        kept = "a different value is refused" if declared.refuse else "the collection's is kept"
        rows.append(f"| {keyword} | {flags} | {shown} | {kept} | {declared.help.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(settings_table(), end="")
