"""A reranked search's second stage as a server runs it, query after query over the same candidates
(the page's rerank toggle, `faste-mm search --rerank` through `faste-mm serve`): the first query
(every cache cold), the second (a new query: tower features, resized images and encoded tails
kept) and warm queries, with and without the documents' encoded tails (`--tails off,on`; off is the
path before them: the processor and a SHA-256 per candidate on every query). Each contender has
its own caches over one loaded model; its first and second queries are mirrored too. Rows say where
a query's seconds go (preparing pairs, the model's forward, the tower) and the tokens per pair.

    faste-mm bench rerank-warm --inputs image:640x480 --n 50 --threads 1     (the tiny test reranker)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from faste_mm.bench.inputs import make_inputs
from faste_mm.bench.options import add_device, add_inputs, add_model, add_rounds, add_threads, apply_threads, names
from faste_mm.bench.rounds import mirrored_rounds
from faste_mm.bench.schema import SuiteRun
from faste_mm.model.cpu.machine import device_name
from faste_mm.model.items import Item
from faste_mm.model.rerank.pair_format import VLPairSerializer
from faste_mm.model.rerank.reranker import Reranker
from faste_mm.tools.shapes import qwen_tokenizer_dir

QUERIES = ("a red bicycle leaning on a wall", "a sunset over the sea", "a cat asleep on a sofa",
           "children playing in the snow", "a plate of pasta", "the old town at night")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_inputs(parser, "image:640x480", n=50)
    add_model(parser, "reranker (Qwen3-VL with its LM head; default: the tiny test reranker, faste_mm.testing)")
    add_device(parser)
    parser.add_argument("--tails", default="off,on", help="documents' encoded tails kept across queries: off (the "
                        "processor and a hash per candidate and query), on (the default); comma-separated (default off,on)")
    add_rounds(parser, default=2)
    add_threads(parser)


def run(args: argparse.Namespace) -> SuiteRun:
    apply_threads(args)
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        path = args.model
        if path is None:
            from faste_mm.testing import build_tiny_model

            path = build_tiny_model(Path(tmp) / "tiny-reranker", "qwen3_vl_reranker")
        documents = [Item(image=d) if not isinstance(d, Item) else d for d in make_inputs(
            args.inputs, args.n, Path(tmp) / "inputs", AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir())))]
        started = time.perf_counter()
        base = Reranker.from_pretrained(str(path), device=args.device, dtype=args.dtype)
        load_s = time.perf_counter() - started
        contenders = {f"tails {mode}": _contender(base, mode == "on") for mode in names(args.tails)}
        queries = iter(QUERIES * (2 + args.repeats))
        first = mirrored_rounds({name: lambda rr=rr: rr.score(next(queries), documents) for name, rr in contenders.items()},
                                1, warmup=0, device=base.backbone.device)
        second = mirrored_rounds({name: lambda rr=rr: rr.score(next(queries), documents) for name, rr in contenders.items()},
                                 1, warmup=0, device=base.backbone.device)
        warm = mirrored_rounds({name: lambda rr=rr: rr.score(next(queries), documents) for name, rr in contenders.items()},
                               args.repeats, warmup=0, device=base.backbone.device)
        prepared = base.prepare_query(QUERIES[0])
        tokens = [base.pair_tokens(prepared, d) for d in documents[:4]]
        device, dtype = device_name(base.backbone.device), str(base.backbone.dtype).removeprefix("torch.")
    rows = []
    for name in contenders:
        stats = warm[name].output.stats
        rows.append({"contender": name, "first_s": first[name].mean, "second_s": second[name].mean,
                     "warm_s": warm[name].mean, "warm_rounds_s": list(warm[name].seconds),
                     "warm_prep_s": stats.serialize_s, "warm_forward_s": stats.forward_s,
                     "warm_tower_s": sum(b.tower_s for b in stats.batches),
                     "warm_decoder_s": sum(b.decoder_s for b in stats.batches),
                     "batches": [b.batch_size for b in stats.batches], "padded_length": [b.padded_lengths[0] for b in stats.batches],
                     "prefix_reused": stats.prefix_reused})
    params = {"inputs": args.inputs, "n": args.n, "model": str(args.model or "tiny test reranker"), "load_s": load_s,
              "pair_tokens": tokens, "repeats": args.repeats}
    text = "\n".join([f"load {load_s:.2f} s; prompt tokens per pair {tokens}",
                      "| contender | first s | second s | warm s | warm prep s (threads' sum) | warm forward s | warm tower s | batches |",
                      "|---|---:|---:|---:|---:|---:|---:|---|",
                      *(f"| {r['contender']} | {r['first_s']:.2f} | {r['second_s']:.2f} | {r['warm_s']:.2f} | "
                        f"{r['warm_prep_s']:.2f} | {r['warm_forward_s']:.2f} | {r['warm_tower_s']:.2f} | {r['batches']} |"
                        for r in rows)])
    return SuiteRun(rows, params, device, dtype, text=text)


def _contender(base: Reranker, tails: bool) -> Reranker:
    """A reranker over `base`'s loaded model with caches of its own; without tails, its pairs are
    encoded whole (the serializer of the path before them)."""
    rr = Reranker(base.loaded, batching=base.batching, serializer=base.serializer.config)
    if not tails and isinstance(rr.serializer, VLPairSerializer):
        rr.serializer = VLPairSerializer(base.loaded.preprocessor, base.serializer.config, rr.resized_images)
        rr.document_tails = None
    return rr
