"""One error family for faste-mm: every message names the item or file, says why, and what to do.

Subclasses also inherit the natural builtin so callers that catch ValueError/OSError keep working.
"""

from __future__ import annotations


class FasteError(Exception):
    """Base class of every error faste-mm raises on purpose."""


class ConfigError(FasteError, ValueError):
    """A configuration field has an invalid value (the message names field, value and valid range)."""


class InputError(FasteError, ValueError):
    """One input item cannot be read or serialized (the message names the item and its position)."""


class ModelLoadError(FasteError, OSError):
    """A model, processor or tokenizer cannot be loaded or is not supported."""


class CollectionError(FasteError, RuntimeError):
    """A collection on disk is missing, locked, inconsistent or incompatible with the request."""
