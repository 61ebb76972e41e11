"""Query understanding's cost per query (retrieval/query_understanding.py): a fixed list of queries
in the five languages, with the traps, understood against a collection's places; the time per
query (median and worst of --rounds), and the one-time costs (place names, compiled patterns).

    faste-mm bench query-words [--rounds 200]

No model and no collection: the places are a fixed list of cities, as a collection's facts name them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import date

from faste_mm.bench.schema import SuiteRun
from faste_mm.retrieval.place_names import KnownPlace, place_names
from faste_mm.retrieval.query_understanding import understand

TODAY = date(2024, 11, 2)
PLACES = [KnownPlace("Lisbon", "Lisbon", "Portugal", "Intendente"), KnownPlace("Berlin", "State of Berlin", "Germany", "Mitte"),
          KnownPlace("Lima", "Lima region", "Peru", "Breña"), KnownPlace("Kyoto", "Kyoto", "Japan"),
          KnownPlace("Nairobi", "Nairobi County", "Kenya"), KnownPlace("Paris", "Île-de-France", "France"),
          KnownPlace("Madrid", "Madrid", "Spain", "Sol"), KnownPlace("Tokyo", "Tokyo", "Japan"),
          KnownPlace("Beijing", "Beijing", "China"), KnownPlace("Amman", "Amman", "Jordan")]
QUERIES = (
    "beach in Lisbon last summer", "receipts from March", "dogs between 2019 and 2021", "hiking from May to July 2024",
    "sunset shot on a Pixel", "4 stars", "PDFs about taxes", 'invoice "ACME GmbH" from last year',
    "Fotos aus Kyoto 2019", "Strand in Lissabon im letzten Sommer", "Bilder mit 4 Sternen", "Katze mit meinem iPhone",
    "plage à Lisbonne l'été dernier", "photos de juillet 2023", "chats entre 2019 et 2021",
    "playa en Lisboa el verano pasado", "fotos de julio de 2023", "fotos con mi Pixel",
    "2023年7月の写真", "リスボンの写真", "去年の夏の写真", "京都で撮った写真 2019年",
    "china plates", "a may flower", "jordan shoes", "a red bicycle leaning on a wall by the sea at dawn",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=200, help="times each query is understood (default 200)")


def run(args: argparse.Namespace) -> SuiteRun:
    started = time.perf_counter()
    places = place_names(PLACES)
    names_s = time.perf_counter() - started
    started = time.perf_counter()
    understand("warm up: compile the patterns in 2019", TODAY, places)
    compile_s = time.perf_counter() - started
    rows = []
    for query in QUERIES:
        times = []
        for _ in range(max(1, args.rounds)):
            started = time.perf_counter()
            understood = understand(query, TODAY, places)
            times.append(time.perf_counter() - started)
        rows.append({"query": query, "median_ms": statistics.median(times) * 1e3, "max_ms": max(times) * 1e3,
                     "understood": understood.summary() or f"(meaning) '{understood.text}'"})
    medians = [r["median_ms"] for r in rows]
    text = "\n".join([
        f"place names for {len(PLACES)} places: {names_s:.2f} s once (GeoNames and CLDR loaded); "
        f"patterns compiled: {compile_s * 1e3:.0f} ms once",
        f"per query: median {statistics.median(medians):.3f} ms, slowest query's median {max(medians):.3f} ms",
        "", "| query | median ms | max ms | understood |", "|---|---:|---:|---|",
        *(f"| {r['query']} | {r['median_ms']:.3f} | {r['max_ms']:.3f} | {r['understood']} |" for r in rows)])
    params = {"rounds": args.rounds, "queries": len(QUERIES), "places": len(PLACES), "today": TODAY.isoformat(),
              "place_names_s": names_s, "compile_ms": compile_s * 1e3}
    return SuiteRun(rows, params, "cpu", text=text)
