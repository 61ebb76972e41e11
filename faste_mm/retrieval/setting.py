"""How one collection setting is declared: `Setting` (where a `CollectionProfile` field is stored,
which values are valid, whether a different value on an existing collection is refused, how the
Python API and the command line spell it, and its help) and `Flag` (one command-line flag of it).

profile.py declares every setting once with `setting(...)` on its field; the rest of faste-mm
reads the declarations: the profile's checks and stored form, the keywords of `Retriever`'s
constructors, the flags of `faste-mm index` and `serve` (cli/setting_flags.py), the CLI's error
words, the settings table of docs/collections.md. Plain data: no torch, no FAISS.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from faste_mm.errors import ConfigError
from faste_mm.indexers.manifest import put_key  # noqa: F401  (the profile writes its keys as the manifest does)

if TYPE_CHECKING:
    from faste_mm.indexers.manifest import Stored

ABSENT = object()  # a manifest value that is not there (a setting newer than the collection)


@dataclass(frozen=True, slots=True)
class Flag:
    """One command-line flag of a setting; its environment variable is FASTE_MM_ + the flag's name.

    type: what the flag's value parses as (int, float, str). help: its help text (units, default).
    part: for a setting made of parts (video), the part the flag sets; None = the whole setting.
    unit: the setting's value is the flag's value times this (--visual-tokens N = N x 1024 px).
    min / max: bounds the command line checks before anything runs (inclusive).
    """

    name: str
    type: type
    help: str
    part: str | None = None
    unit: int = 1
    min: float | None = None
    max: float | None = None

    @property
    def param(self) -> str:
        """The flag as a Python parameter name (--video-fps -> video_fps)."""
        return self.name.lstrip("-").replace("-", "_")

    @property
    def envvar(self) -> str:
        return "FASTE_MM_" + self.param.upper()


@dataclass(frozen=True, slots=True)
class Setting:
    """How one profile field is stored, checked and given.

    key: where it lives in manifest.json, a dotted path ("serializer.max_pixels").
    flag: how messages name it (its first CLI flag, or words when no flag sets it).
    help: one line for the manual (docs/collections.md "Settings").
    flags: the command-line flags that set it (empty: set another way, or not by users).
    keyword: the Python API takes it as a keyword of its field's name (`Retriever.from_pretrained`,
        `for_collection`, `open`, and `faste-mm serve`'s flags for the refusing ones).
    valid: None or a check of a given value (None values are not checked); `rule` words it.
    missing: its value in a manifest written before the field existed; ABSENT = the field's default.
    refuse: a user value that differs from an existing collection's is refused (vectors made
        with it would not be comparable); False: informational, the collection's value is kept.
    carry: `index --reindex` with the same model keeps the collection's value unless given again
        (`CollectionProfile.carried_over`); False: re-resolved (default, calibration, plan).
    """

    key: str
    flag: str
    help: str
    flags: tuple[Flag, ...] = ()
    keyword: bool = True
    valid: Callable[[Any], bool] | None = None
    rule: str = ""
    missing: Any = ABSENT
    refuse: bool = True
    carry: bool = False

    def check(self, owner: str, name: str, value: Any) -> None:
        """ConfigError naming `owner.name`, the rule and the value when `value` breaks the rule."""
        if value is not None and self.valid is not None and not self.valid(value):
            raise ConfigError(f"{owner}.{name} must be {self.rule}, got {value!r}")


def setting(default: Any, key: "str | Stored", flag: str, help: str, *, flags: tuple[Flag, ...] = (),
            keyword: bool = True, valid: Callable[[Any], bool] | None = None, rule: str = "", missing: Any = ABSENT,
            refuse: bool = True, carry: bool = False, factory: Any = None) -> Any:
    """A dataclass field of `CollectionProfile` carrying its `Setting`.

    key: the manifest key, or the storage layer's own declaration of a field it reads itself
    (`Manifest.declared("dim")`): its key and check then come from there (a `rule` given here
    rewords the check), and `default` ABSENT means the stored default."""
    if not isinstance(key, str):
        valid, rule = valid or key.valid, rule or key.rule
        default = key.default if default is ABSENT else default
        key = key.key
    meta = {"setting": Setting(key, flag, help, flags, keyword, valid, rule, missing, refuse, carry)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def settings_of(cls: type) -> dict[str, Setting]:
    """Every declared setting of dataclass `cls`, by field name, in declaration order."""
    return {f.name: f.metadata["setting"] for f in dataclasses.fields(cls)}


def keywords_of(cls: type) -> tuple[str, ...]:
    """The settings the Python API takes as keywords (`Setting.keyword`)."""
    return tuple(name for name, s in settings_of(cls).items() if s.keyword)


def given_settings(cls: type, given: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`given` without the ones not given (None), after checking every name is a keyword setting
    of `cls`: ConfigError naming `where`, the unknown names and the valid ones."""
    valid = keywords_of(cls)
    unknown = sorted(set(given) - set(valid))
    if unknown:
        raise ConfigError(f"{where}: unknown collection settings {unknown}; valid ones are {list(valid)}")
    return {name: value for name, value in given.items() if value is not None}


def flag_settings(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """Command-line flag values (by `Flag.param`; None = not given) -> the settings they give,
    by field name: a part flag gives a mapping of parts ({"fps": 2.0}), a scaled flag its value
    times its unit. ConfigError (in flag words) when two flags of one setting or part are given."""
    out: dict[str, Any] = {}
    chosen: dict[tuple[str, str | None], str] = {}
    for name, s in settings_of(cls).items():
        for flag in s.flags:
            value = values.get(flag.param)
            if value is None:
                continue
            slot = (name, flag.part)
            if slot in chosen:
                raise ConfigError(f"give {chosen[slot]} or {flag.name}, not both ({chosen[slot]} "
                                  f"{values[chosen[slot].lstrip('-').replace('-', '_')]}, {flag.name} {value})")
            chosen[slot] = flag.name
            value = value * flag.unit if flag.unit != 1 else value
            if flag.part is None:
                out[name] = value
            else:
                out.setdefault(name, {})[flag.part] = value
    return out


def get_key(stored: Mapping[str, Any], key: str) -> Any:
    """The value at dotted `key` in a manifest dict, ABSENT when a part is missing (or None: no
    FastE settings); ConfigError naming the part when one is not an object (a damaged manifest)."""
    node: Any = stored
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if node is None:
            return ABSENT
        if not isinstance(node, Mapping):
            raise ConfigError(f"manifest field {'.'.join(parts[:depth])!r} must be an object, got {node!r}")
        if part not in node:
            return ABSENT
        node = node[part]
    return node
