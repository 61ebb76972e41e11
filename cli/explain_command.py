"""`faste-mm explain QUERY ID`: why an item of a collection matched a query, as the reranker's
readout sees it (`Reranker.explain`: its attention over the query, the item's picture and text
spans; attention, not attribution). The collection's running `faste-mm serve` answers when it
reranks with the same model (POST /explain, nothing heavy imported here); otherwise the reranker
loads here (--rerank, else the collection's, as `search --rerank`). A table, or --format json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from faste_mm.cli.common import fail, markup_safe, print_json, setup_logging, stdout
from faste_mm.cli.options import CollectionOption, Debug, Device, Format, NoServer, OutputFormat, Rerank
from faste_mm.errors import FasteError

TOP_SPANS = 20  # the table's text spans, by attention (--format json has them all)


def explain_command(
    query: str = typer.Argument(..., help="The query text the item was found for."),
    item_id: int = typer.Argument(..., min=0,
                                  help="The item's id (`faste-mm search --format json` shows each hit's id)."),
    collection: CollectionOption = None,
    layer: Optional[int] = typer.Option(None, "--layer", envvar="FASTE_MM_EXPLAIN_LAYER", min=0, show_default=False,
                                        help="Decoder layer whose readout attention is shown. Default: the layer "
                                             "FastE's alignment trigger picks for the pair."),
    rerank: Rerank = None,
    output: OutputFormat = Format.table,
    no_server: NoServer = False,
    device: Device = "auto",
    debug: Debug = False,
) -> None:
    """Why an item matched a query: the reranker's score and where its readout looked (query, picture, text).
    Uses --rerank, else the collection's reranker; a running `faste-mm serve` with that reranker answers."""
    from faste_mm.cli.server_search import explain_through_server
    from faste_mm.retrieval.locations import collection_path

    setup_logging(debug)
    try:
        root = collection_path(collection)
        # a local folder as the server names it (absolute); a hub id as given
        model = str(Path(rerank).absolute()) if rerank is not None and Path(rerank).exists() else rerank
        served = None if no_server else explain_through_server(root, query, item_id, layer, model, debug)
        why, reranker = served if served is not None else _explain_here(root, query, item_id, layer, model, device)
    except FasteError as error:
        fail(error, debug)
    if output is Format.json:
        print_json({"query": query, "collection": str(root), "reranker": reranker, **why})
        return
    _print_table(query, why, reranker)


def _explain_here(root: Path, query: str, item_id: int, layer: int | None, model: str | None,
                  device: str) -> tuple[dict, str]:
    """(`Reranker.explain(...).to_dict()` with the item, the reranker's id), run in this process."""
    from faste_mm import Item
    from faste_mm.cli.collection_commands import load_reranker
    from faste_mm.cli.progress import quiet_transformers
    from faste_mm.errors import ConfigError, InputError
    from faste_mm.indexers import Collection
    from faste_mm.retrieval.stored_files import stored_item

    with Collection.open(root) as col:  # the id is checked before any model loads
        if item_id not in col.live_ids([item_id]):
            raise InputError(f"id {item_id}: no such item in the collection {root}; `faste-mm search QUERY "
                             f"--format json` shows the items' ids")
        record = col.get([item_id])[0]
    document = stored_item(record)  # only the file indexed, read back checked (as serve's /explain)
    quiet_transformers()
    reranker = load_reranker(model, root, "0", "none", device)  # explain runs the full forward: no FastE
    if reranker is None:
        raise ConfigError(f"no reranker to explain with: {root} records none; give --rerank MODEL (e.g. "
                          f"Qwen/Qwen3-VL-Reranker-2B), or index the collection with --reranker MODEL")
    why = reranker.explain(Item(text=query), document, layer=layer).to_dict()
    return {**why, "item": {"id": record.id, "uri": record.uri, "page": record.page}}, reranker.model_id


def _print_table(query: str, why: dict, reranker: str) -> None:
    item = why["item"]
    where = "" if item["page"] is None else f", page {item['page']}"
    table = Table(title=f"why item {item['id']} ({markup_safe(item['uri'])}{where}) matched {markup_safe(repr(query))}",
                  caption=markup_safe(why["label"]))
    table.add_column("", overflow="fold")
    table.add_column("value", justify="right", overflow="fold")
    rows = [("reranker", markup_safe(reranker)), ("score", f"{why['score']:.4f}"),
            ("layer shown", str(why["layer"])), ("attention on the query", f"{why['query_share']:.1%}"),
            ("attention on the item", f"{why['document_share']:.1%}")]
    rows += [(f"  its {image['kind']} ({image['size'][0]}x{image['size'][1]} px)", f"{image['total']:.1%}")
             for image in why["images"]]
    rows += [("  its text", f"{sum(span['weight'] for span in why['text']):.1%}"),
             ("  prompt template", f"{why['template_share']:.1%}"),
             ("truncated to the reranker's length", "yes" if why["truncated"] else "no")]
    for name, value in rows:
        table.add_row(name, value)
    stdout.print(table)
    spans = sorted(why["text"], key=lambda span: -span["weight"])[:TOP_SPANS]
    if spans:
        text = Table(title=f"the item's text by attention (top {len(spans)} of {len(why['text'])} spans)")
        for column, justify in (("attention", "right"), ("characters", "right"), ("text", "left")):
            text.add_column(column, justify=justify, overflow="fold")
        for span in spans:
            text.add_row(f"{span['weight']:.2%}", f"{span['start']}-{span['end']}", markup_safe(span["text"]))
        stdout.print(text)
