"""`faste-mm calibrate`: choose FastE's threshold theta on your own documents, without labels;
optionally save it for the model (and a collection) so `index` uses it."""

from __future__ import annotations

import json
import logging
import random
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from faste_mm.cli.common import fail, print_json, setup_logging, stderr, stdout
from faste_mm.cli.options import (DEFAULT_BATCH_TOKENS, DEFAULT_MODEL, DOCUMENT_R_MAX, BatchTokens, CollectionOption,
                                  Debug, Device, Dtype, Format, ImageRoot, Model, OutputFormat, Rerank, RerankProtect,
                                  RMax, Threshold, TriggerLayer, Unpadded, WarmupLayer, fast_e_config, one_ratio)
from faste_mm.cli.progress import Progress
from faste_mm.errors import ConfigError, FasteError, InputError


def calibrate_command(
    ctx: typer.Context,
    paths: list[Path] = typer.Argument(None, help="Your documents: files or folders (images, PDFs, .txt/.md)."),
    model: Model = None,
    data: Optional[Path] = typer.Option(None, envvar="FASTE_MM_DATA", help="MMEB data folder (with --task) instead of PATHs; adds Recall@1/10 retention."),
    image_root: ImageRoot = None,
    task: Optional[str] = typer.Option(None, envvar="FASTE_MM_TASK", help="mscoco | docvqa | nights (with --data)."),
    r_max: RMax = None,
    warmup_layer: WarmupLayer = None,
    threshold: Threshold = None,
    trigger_layer: TriggerLayer = None,
    target: Optional[float] = typer.Option(None, envvar="FASTE_MM_TARGET", show_default=False,
                                           help="What a theta must reach: the mean cosine to the full forward (default "
                                                "0.99); with --rerank, the share of the full forward's top-k kept in "
                                                "place (default 0.9)."),
    sample: int = typer.Option(64, envvar="FASTE_MM_SAMPLE", help="Documents sampled (seeded) from PATHs; with --data, the first N queries."),
    save: bool = typer.Option(False, "--save", help="Save for this model (per-user file) and, with -c, in the collection."),
    collection: CollectionOption = None,
    out: Path = typer.Option(Path("faste-mm-calibration"), "--out", envvar="FASTE_MM_CALIBRATION_OUT", help="Folder for calibration.json and calibration.png."),
    device: Device = "auto",
    dtype: Dtype = "auto",
    batch_tokens: BatchTokens = DEFAULT_BATCH_TOKENS,
    unpadded: Unpadded = "auto",
    output: OutputFormat = Format.table,
    debug: Debug = False,
    rerank: Rerank = None,
    query: list[str] = typer.Option(None, "--query", envvar="FASTE_MM_QUERY", show_default=False,
                                    help="With --rerank: a query to score PATHs against (repeat for several)."),
    rerank_protect: RerankProtect = "none",
    top_k: int = typer.Option(5, "--top-k", envvar="FASTE_MM_TOP_K", min=1, help="With --rerank: the ranks whose order must agree with the full forward."),
) -> None:
    """Recommend the smallest theta whose embeddings stay within --target of the full forward;
    with --rerank MODEL and --query, the smallest whose reranker scores keep the full forward's
    top-k order on PATHs (--target: share of the top-k in place)."""
    from faste_mm import BatchingConfig, Embedder
    from faste_mm.tools.calibration import CalibrationConfig, calibrate, task_labels

    setup_logging(debug, logging.INFO)
    if rerank is not None:
        _refuse_embedding_flags(ctx, debug)
        _calibrate_reranker(rerank, paths or [], query or [], r_max, warmup_layer, threshold, trigger_layer, target, top_k,
                            rerank_protect, sample, save, out, device, dtype, BatchingConfig(batch_tokens=batch_tokens, unpadded=unpadded),
                            output, debug)
        return
    try:
        ratio = one_ratio(r_max)
        if collection is not None:  # calibrating for a collection: its model and r_max unless given
            profile = _collection_profile(collection)
            model = model or profile.model_id
            ratio = profile.r_max if ratio is None else ratio
        model = model or DEFAULT_MODEL
        config = CalibrationConfig(
            fast_e=fast_e_config(DOCUMENT_R_MAX if ratio is None else ratio, warmup_layer, None, trigger_layer),
            thetas=None if threshold is None else (threshold,))
        config = config if target is None else replace(config, target=target)
        batching = BatchingConfig(batch_tokens=batch_tokens, unpadded=unpadded)
        if sample < 2:
            raise ConfigError(f"--sample must be >= 2, got {sample}")
        # Everything the user typed is checked before the model loads: a typo must not cost a
        # model download or load.
        labelled = _mmeb_task(paths or [], data, task, image_root, sample)
        items, unreadable = (labelled.candidate_items(), []) if labelled is not None else _documents(paths or [], sample)
        _make_out(out)
        if save and collection is not None:
            _check_collection(collection, model)
        with Progress() as progress:
            with progress.loading(model):
                embedder = Embedder.from_pretrained(model, device=device, dtype=dtype, batching=batching)
            labels = None if labelled is None else task_labels(embedder, labelled)
            progress.status(f"calibrating on {len(items)} documents ({embedder.backbone.shape.num_layers} layers)...")
            calibration = calibrate(embedder, items, config, labels, progress=progress)
        calibration = replace(calibration, skipped=[*unreadable, *calibration.skipped])  # the report lists both
        _write_report(calibration, out)
    except FasteError as error:
        fail(error, debug)
    # The table (or JSON) comes first, whatever --save then says: it is what tells the user
    # how close each theta came when none passed.
    if output is Format.json:
        print_json(calibration.to_dict())
    else:
        _render(calibration)
    stderr.print(f"report: {out / 'calibration.json'}, plot: {out / 'calibration.png'}")
    if save:
        try:
            _save(calibration, collection, out)
        except FasteError as error:
            fail(error, debug)


def _calibrate_reranker(model, paths, queries, r_max, warmup_layer, threshold, trigger_layer, target, top_k, protect,
                        sample, save, out, device, dtype, batching, output, debug) -> None:
    """`calibrate --rerank`: theta for the reranker on every (--query, document of PATHs) pair."""
    from faste_mm.model.rerank.reranker import PROTECT_MODES, Reranker
    from faste_mm.tools.rerank_calibration import RerankCalibrationConfig, calibrate_reranker

    try:
        if save:
            raise ConfigError("--save stores an embedding model's theta; for a reranker pass the recommended theta "
                              "yourself (Reranker.from_pretrained(..., threshold=THETA))")
        if not queries:
            raise ConfigError("--rerank calibrates on your pairs: give at least one --query to score PATHs against")
        if protect not in PROTECT_MODES:
            raise ConfigError(f"--rerank-protect must be {' or '.join(PROTECT_MODES)}, got {protect!r}")
        ratio = one_ratio(r_max)
        config = RerankCalibrationConfig(
            fast_e=fast_e_config(0.5 if ratio is None else ratio, warmup_layer, None, trigger_layer), top_k=top_k,
            thetas=None if threshold is None else (threshold,))
        config = config if target is None else replace(config, target=target)  # None: the reranker's own default
        documents, unreadable = _documents(paths, sample)
        _make_out(out)
        with Progress() as progress:
            with progress.loading(model):
                reranker = Reranker.from_pretrained(model, device=device, dtype=dtype, batching=batching, protect=protect)
            calibration = calibrate_reranker(reranker, [(q, documents) for q in queries], config, progress=progress)
        try:
            (out / "rerank_calibration.json").write_text(json.dumps(calibration.to_dict(), indent=2))
        except OSError as error:
            raise ConfigError(f"--out {out}: cannot write the report ({error}); choose another folder") from None
    except FasteError as error:
        fail(error, debug)
    for reason in unreadable:
        stderr.print(f"[yellow]skipped[/yellow] {reason}")
    if output is Format.json:
        print_json(calibration.to_dict())
    else:
        _render_reranker(calibration)
    stderr.print(f"report: {out / 'rerank_calibration.json'}")


# calibrate's options that only the embedding calibration reads (--save is refused with its own advice)
_EMBEDDING_ONLY = (("model", "--model"), ("data", "--data"), ("task", "--task"), ("image_root", "--image-root"),
                   ("collection", "--collection"))


def _refuse_embedding_flags(ctx: typer.Context, debug: bool) -> None:
    """--rerank calibrates the reranker it names on PATHs: an embedding-only flag typed with it is
    refused, naming it; one that comes from a FASTE_MM_* variable (set for other commands) is
    ignored with a warning."""
    typed, from_env = [], []
    for name, flag in _EMBEDDING_ONLY:
        source = getattr(ctx.get_parameter_source(name), "name", None)  # typer's own click: compared by name
        if source == "COMMANDLINE":
            typed.append(flag)
        elif source == "ENVIRONMENT":
            from_env.append(flag)
    for flag in from_env:
        stderr.print(f"[yellow]ignored[/yellow] {flag} (from its FASTE_MM_* variable): it applies to the embedding "
                     "calibration, not to --rerank")
    if typed:
        fail(ConfigError(f"{', '.join(typed)} apply to the embedding calibration, not to --rerank (which calibrates "
                         "the reranker it names on PATHs and --query); leave them out"), debug)


def _render_reranker(calibration) -> None:
    table = Table(title=f"reranker calibration of {calibration.model_id} at r_max {calibration.r_max:g}, protect "
                        f"{calibration.protect} ({calibration.n_queries} queries, {calibration.n_pairs} pairs)")
    for column in ("theta", "trigger layers (batches)", "mean layer", f"top-{calibration.top_k} agree", "top-1 agree",
                   "mean |d score|", "max |d score|", "FLOPs red.", "ok"):
        table.add_column(column, justify="right")
    for r in calibration.thetas:
        layers = ", ".join(f"L{layer}:{n}" for layer, n in r.trigger_layers.items())
        mark = "*" if r.theta == calibration.threshold else ("yes" if r.meets_target else "")
        table.add_row(f"{r.theta:g}", layers, f"{r.mean_trigger_layer:.1f}", f"{r.top_k_agreement:.1%}", f"{r.top1_agreement:.1%}",
                      f"{r.mean_score_diff:.4f}", f"{r.max_score_diff:.4f}", f"{r.flops_reduction:.1%}", mark)
    stdout.print(table)
    if calibration.threshold is None:
        stdout.print("no theta reaches the target: lower --target or --r-max")
    else:
        stdout.print(f"recommended theta: {calibration.threshold:g} (* above)")


def _mmeb_task(paths: list[Path], data: Optional[Path], task: Optional[str], image_root: Optional[Path], sample: int):
    """The labelled MMEB task for --data/--task (files, columns and images checked), or None."""
    if data is None and task is None:
        if image_root is not None:  # may come from FASTE_MM_IMAGE_ROOT set for `eval`: not fatal
            stderr.print(f"[yellow]ignored[/yellow] --image-root {image_root}: it applies to --data only")
        return None
    if data is None or task is None or paths:
        raise ConfigError("give PATHs, or --data DIR with --task (not both)")
    if image_root is not None and not image_root.is_dir():
        raise ConfigError(f"--image-root {image_root}: folder not found; give the folder the relative image paths in --data start from")
    from faste_mm.datasets import load_task

    return load_task(task, data, image_root=image_root, limit=sample)


def _documents(paths: list[Path], sample: int) -> tuple[list, list[str]]:
    """The sampled documents under PATHs, and why each unreadable text file was skipped (also
    printed); a PATH that does not exist is an error (a typo)."""
    if not paths:
        raise ConfigError("give the documents to calibrate on (PATHs), or --data with --task")
    missing = [path for path in paths if not path.exists()]
    if missing:
        raise InputError(f"{missing[0]}: file or folder not found ({len(missing)} of {len(paths)} PATHs missing); check the path")
    from faste_mm.retrieval.scanning import document_items

    items, unreadable = document_items(paths)
    for reason in unreadable:  # one unreadable file must not stop the calibration
        stderr.print(f"[yellow]skipped[/yellow] {reason}")
    if len(items) < 2:
        names = ", ".join(str(path) for path in paths)
        raise InputError(f"{names}: {len(items)} document(s) found; calibration needs at least 2 (images, PDFs, .txt/.md files)")
    if len(items) > sample:
        items = random.Random(0).sample(items, sample)
    return items, list(unreadable)


def _collection_profile(collection: str):
    """The settings of the collection -c names (CollectionError when there is none)."""
    from faste_mm.retrieval.maintenance import collection_path
    from faste_mm.retrieval.profile import read_profile

    return read_profile(collection_path(collection))


def _check_collection(collection: str, model: str) -> None:
    """--save -c: the collection must exist, run FastE and use this model, known before the run."""
    from faste_mm.retrieval.calibrations import check_collection_target
    from faste_mm.retrieval.maintenance import collection_path
    from faste_mm.retrieval.profile import model_name

    root = collection_path(collection)
    check_collection_target(root, _collection_profile(collection), model_name(model), None, revision_known=False)


def _make_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: a file is in the way; --out names a folder (for calibration.json and calibration.png)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"--out {out}: cannot create the folder ({error}); choose another path") from None


def _write_report(calibration, out: Path) -> None:
    from faste_mm.tools.calibration import plot_calibration

    try:
        (out / "calibration.json").write_text(json.dumps(calibration.to_dict(), indent=2))
        plot_calibration(calibration, out / "calibration.png")
    except OSError as error:
        raise ConfigError(f"--out {out}: cannot write the report ({error}); choose another folder") from None


def _save(calibration, collection: Optional[str], out: Path) -> None:
    from faste_mm.retrieval.calibrations import save_calibration

    if calibration.threshold is None:
        raise ConfigError(
            f"nothing saved: no candidate theta reached mean cos >= {calibration.target:g} with p5 cos >= "
            f"{calibration.p5_floor:g} at r_max {calibration.r_max:g}; each theta's mean and p5 cos are in "
            f"the table and in {out / 'calibration.json'}. Lower --target or --r-max and run again with --save"
        )
    stderr.print(f"saved for {calibration.model_id} in {save_calibration(calibration)}")
    if collection is None:
        return
    from faste_mm.retrieval.calibrations import apply_calibration

    root = apply_calibration(calibration, collection)
    stderr.print(f"collection {root} now embeds new documents with theta {calibration.threshold:g}")


def _render(calibration) -> None:
    table = Table(title=f"calibration of {calibration.model_id} at r_max {calibration.r_max:g} (target cos {calibration.target:g})")
    for column in ("theta", "trigger layers (batches)", "mean layer", "mean cos", "p5 cos", "FLOPs red.", "R@1 / R@10 ret.", "ok"):
        table.add_column(column, justify="right")
    for r in calibration.thetas:
        recall = "-" if r.recall_retention is None else " / ".join(
            "-" if v is None else f"{v:.1%}" for v in (r.recall_retention["recall@1"], r.recall_retention["recall@10"])
        )
        layers = ", ".join(f"L{layer}:{n}" for layer, n in r.trigger_layers.items())
        mark = "*" if r.theta == calibration.threshold else ("yes" if r.meets_target else "")
        table.add_row(f"{r.theta:g}", layers, f"{r.mean_trigger_layer:.1f}", f"{r.mean_cos:.4f}", f"{r.p5_cos:.4f}", f"{r.flops_reduction:.1%}", recall, mark)
    stdout.print(table)
    if calibration.threshold is None:
        stdout.print("no theta reaches the target: lower --target or --r-max")
    else:
        stdout.print(f"recommended theta: {calibration.threshold:g} (* above; {calibration.describe()})")
