"""The CLI's shared options, each declared once (an `Annotated` type used by every command that
takes it) with one FASTE_MM_* environment variable, and the builders that turn them into the
library's configs (`fast_e_config`, `ratios`). Help texts state units and defaults.

The FastE flags (--r-max --warmup-layer --threshold --trigger-layer) are on every command that
embeds: index, embed, eval, calibrate, serve, bench.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from faste_mm.errors import ConfigError
from faste_mm.cli.setting_flags import setting_option
from faste_mm.model.cpu.machine import BATCH_TOKENS_DEFAULT, DEVICE_CHOICES, DTYPE_CHOICES, UNPADDED_CHOICES
from faste_mm.retrieval.profile import DEFAULT_MODEL, DOCUMENT_R_MAX, SWEEP_R_MAX  # noqa: F401  (serve, embed)

if TYPE_CHECKING:
    from faste_mm.model.faste import FastEConfig
    from faste_mm.model.patch_dedup import PatchDedupConfig

DEFAULT_BATCH_TOKENS = None  # by device: machine_plan.BATCH_TOKENS, as BATCH_TOKENS_DEFAULT words it
SERVE_MERGE_TOKENS = 16384  # serve: what concurrent requests are merged up to when --batch-tokens is not given


class Format(str, Enum):
    """What a command prints on stdout (files are written with --out)."""

    table = "table"
    json = "json"


# The flags that are collection settings are declared with them (CollectionProfile, cli/setting_flags.py);
# the commands that embed without a collection (embed, eval, bench, calibrate, plan) take the same ones.
Model = setting_option("--model")
RMax = setting_option("--r-max", str)  # eval, bench and plan sweep: comma-separated ratios (`ratios`, `one_ratio`)
WarmupLayer = setting_option("--warmup-layer")
Threshold = setting_option("--threshold")
TriggerLayer = setting_option("--trigger-layer")
PatchDedup = setting_option("--patch-dedup")
BatchTokens = Annotated[Optional[int], typer.Option(
    "--batch-tokens", envvar="FASTE_MM_BATCH_TOKENS", min=1, show_default=False,
    help=f"Padded tokens per model batch (serve: also what concurrent requests are merged up to). "
         f"{BATCH_TOKENS_DEFAULT} (serve merges requests up to {SERVE_MERGE_TOKENS}).")]
Unpadded = Annotated[str, typer.Option(
    "--unpadded", envvar="FASTE_MM_UNPADDED", show_default=False,
    help=f"Layers after FastE compression: {UNPADDED_CHOICES}; bench compares several, comma-separated. Default auto.")]
Device = Annotated[str, typer.Option(
    "--device", envvar="FASTE_MM_DEVICE", show_default=False, help=f"{DEVICE_CHOICES}. Default auto.")]
MaxPixels = setting_option("--max-pixels")
VisualTokens = setting_option("--visual-tokens")
Dtype = Annotated[str, typer.Option(
    "--dtype", envvar="FASTE_MM_DTYPE", show_default=False,
    help=f"Model weights and compute: {DTYPE_CHOICES}. Default auto.")]
OutputFormat = Annotated[Format, typer.Option(
    "--format", envvar="FASTE_MM_FORMAT", show_default=False,
    help="Results on stdout as a table or as JSON (documented schema). Default table.")]
Debug = Annotated[bool, typer.Option(
    "--debug", envvar="FASTE_MM_DEBUG", help="Show tracebacks and debug logs.")]
NoServer = Annotated[bool, typer.Option(
    "--no-server", envvar="FASTE_MM_NO_SERVER",
    help="Do the work in this process even when a faste-mm serve is serving the collection (default: ask "
         "that server when it can answer: a text search, reranked with its reranker or not; info; explain with "
         "its reranker).")]
CollectionOption = Annotated[Optional[str], typer.Option(
    "--collection", "-c", envvar="FASTE_MM_COLLECTION", show_default=False,
    help="Collection: a NAME under the user data directory (user_data_dir('faste-mm')/collections/NAME), or a "
         "DIR (contains '/' or starts with '.'). Default: the 'default' collection.")]
ImageRoot = Annotated[Optional[Path], typer.Option(
    "--image-root", envvar="FASTE_MM_IMAGE_ROOT", show_default=False,
    help="Folder the relative image paths of --data start from. Default: found under --data.")]

FollowLinks = Annotated[bool, typer.Option(
    "--follow-links", envvar="FASTE_MM_FOLLOW_LINKS",
    help="Also index file links whose target lies outside the folders given (default: such links are skipped "
         "and counted, so a link planted in a folder cannot pull in a private file).")]


def ratios(text: str | None, default: tuple[float, ...] = SWEEP_R_MAX) -> tuple[float, ...]:
    """--r-max as a sweep: comma-separated ratios, e.g. "0,0.3,0.5,0.7" (ranges are checked by
    FastEConfig); `default` when not given."""
    if text is None:
        return default
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values:
        raise ConfigError(f"--r-max takes ratios in [0, 1), comma-separated for a sweep, e.g. 0,0.3,0.5,0.7; got {text!r}")
    return values


def one_ratio(text: str | None) -> float | None:
    """--r-max for a command that embeds with one setting (None when not given)."""
    if text is None:
        return None
    values = ratios(text)
    if len(values) != 1:
        raise ConfigError(f"--r-max takes one ratio here (sweeps are for eval, bench and plan); got {text!r}")
    return values[0]


def fast_e_config(r_max: float = 0.0, warmup_layer: int | None = None, threshold: float | None = None,
                  trigger_layer: int | None = None, seed: int = 0) -> "FastEConfig":
    """The FastE flags as one `FastEConfig` (sweeps replace its r_max by each of theirs).
    ConfigError (in flag words, see common.in_cli_words) for a value out of range."""
    from faste_mm.model.faste import FastEConfig

    return FastEConfig(r_max=r_max, warmup_layer=warmup_layer, threshold=threshold, trigger_layer=trigger_layer,
                       seed=seed)

def patch_dedup_config(mode: str | None) -> "PatchDedupConfig | None":
    """--patch-dedup as the library's config (None when off or not given); ConfigError naming the
    flag for an unknown mode."""
    from faste_mm.model.patch_dedup import PATCH_DEDUP_MODES, dedup_config

    if mode is not None and mode not in PATCH_DEDUP_MODES:
        raise ConfigError(f"--patch-dedup {mode!r}: choose one of {', '.join(PATCH_DEDUP_MODES)}")
    return None if mode is None else dedup_config(mode)


DEFAULT_RERANKER = "Qwen/Qwen3-VL-Reranker-2B"
Rerank = Annotated[Optional[str], typer.Option(
    "--rerank", envvar="FASTE_MM_RERANK", show_default=False,
    help="A reranker (hub id or folder, e.g. Qwen/Qwen3-VL-Reranker-2B) for a second stage: search reranks its top "
         "--rerank-top hits (default: the collection's reranker, index --reranker), eval its top candidates, serve "
         "answers /v1/rerank. Default: none.")]
# eval's --rerank-top (search's is the search option's, cli/search_command.py): the default is shown from eval's
# own parameter, so no number is written here
RerankTop = Annotated[int, typer.Option(
    "--rerank-top", envvar="FASTE_MM_RERANK_TOP", min=1, show_default=True,
    help="Candidates per query the reranker re-scores (eval: each query's top candidates).")]
RerankRMax = Annotated[str, typer.Option(
    "--rerank-r-max", envvar="FASTE_MM_RERANK_R_MAX", show_default=False,
    help="FastE on the reranker: largest share of each pair's prefix removed, 0 <= r < 1 (eval: comma-separated). "
         "Default 0 (the exact score).")]
RerankProtect = Annotated[str, typer.Option(
    "--rerank-protect", envvar="FASTE_MM_RERANK_PROTECT", show_default=False,
    help="none | query (eval also: both): FastE on the reranker may evict the query (none) or never does (query). "
         "Default none.")]
RERANK_TOWER_CACHE_MB = 1024  # model/rerank/tower_cache.DEFAULT_TOWER_CACHE_BYTES in MiB (a test keeps them equal; no torch here)
RerankTowerCacheMb = Annotated[int, typer.Option(
    "--rerank-tower-cache-mb", envvar="FASTE_MM_RERANK_TOWER_CACHE_MB", min=0, show_default=False,
    help=f"The reranker's tower cache: candidate images' and pages' vision features kept across queries (a second "
         f"query over the same candidates runs no vision tower), in MiB; 0 turns it off. Default "
         f"{RERANK_TOWER_CACHE_MB}.")]
