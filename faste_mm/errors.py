"""One error family for faste-mm: every message names the item or file, says why, and what to do.

Subclasses also inherit the natural builtin so callers that catch ValueError/OSError keep working.
"""

from __future__ import annotations


class FasteError(Exception):
    """Base class of every error faste-mm raises on purpose.

    message: what failed, which item or file, why, and advice that holds for every caller.
    hint: what to do in Python words (`on_error='skip'`, `Collection.create`); `str(error)`
        is the message followed by it.
    cli_hint: the same advice in command-line words (`faste-mm index PATH -c DIR`), shown by
        the CLI instead of `hint` (see `cli_message`); None: the CLI shows no hint.
    """

    def __init__(self, message: str, *, hint: str | None = None, cli_hint: str | None = None) -> None:
        super().__init__(message if hint is None else f"{message}; {hint}")
        self.message = message
        self.hint = hint
        self.cli_hint = cli_hint

    def cli_message(self) -> str:
        """The message as the command line says it: its own advice, never the Python API's."""
        return self.message if self.cli_hint is None else f"{self.message}; {self.cli_hint}"


class ConfigError(FasteError, ValueError):
    """A configuration field has an invalid value (the message names field, value and valid range)."""


class InputError(FasteError, ValueError):
    """One input item cannot be read or serialized (the message names the item and its position)."""


class ModelLoadError(FasteError, OSError):
    """A model, processor or tokenizer cannot be loaded or is not supported."""


class CollectionError(FasteError, RuntimeError):
    """A collection on disk is missing, locked, inconsistent or incompatible with the request."""
