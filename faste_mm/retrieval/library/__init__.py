"""faste_mm.retrieval.library: the photo-library wing, what a collection of one's own files gets
beyond search (the `library` bench suite measures it; docs/library.md, docs/photos.md). One line per
module, what it decides and who asks:

- `photo_metadata`: a file's facts at scan time (EXIF, XMP, IPTC, a PDF's info, a video's tags ->
  `ItemFacts`); asked by `ingest` for every file it reads and `indexing` for the unchanged ones.
- `places`: the place names of a GPS position, offline (the city people use, its neighbourhood,
  region and country); asked by `photo_metadata`, and by `retrieval.place_names` for the names a
  query may use (query understanding, which is search's, not the wing's).
- `ocr`: the text inside images and scanned pages, read after an index run into the lexical index
  (`index --ocr`); asked by `indexing` and the `Retriever` (its `OcrEngine`).
- `near_pairs`: the pairs of vectors whose inner product reaches a threshold, array in, array out;
  asked by `duplicates` only.
- `duplicates`: exact and near-duplicate groups with a suggested keeper, model-free (entry point
  `collection_duplicates`); asked by `Retriever.duplicates`, `faste-mm duplicates`, serve's GET /duplicates.
- `watching`: a folder kept in sync (`FolderWatcher`, `WatchOptions`, `SyncReport`): polls or file
  events, settling, then the scan handed to the `Retriever` it is given (`index_scan`); asked by
  `faste-mm watch` and `serve --watch`.
- `watch_status`: a collection's watch.json read back and `info`'s line on it (standard library
  only); asked by `info`, `maintenance` and serve's engine.
- `albums`: saved searches that stay current (`Albums`; `refresh_albums` scores the items an index
  run stored for every album, no model); asked by `indexing` after each run, the `Retriever`
  (`albums()`, with its model to embed a new album's query), `faste-mm album`, serve's /albums and
  the MCP album resources.

Its floor is retrieval's, beside `ingest`: it imports `errors`, the indexers (the facts' rows, the
collection, file names), the core's file decoding (lazily) and retrieval's lower modules (`lexical`,
`stored_files`, `results`, `scanning`); the modules that ask it (`ingest`, `indexing`, `retriever`)
it never imports: `watching` receives its `Retriever`, `albums` a planner that embeds. Nothing below
retrieval imports it; the front ends reach it only through `duplicates`, `watching`, `watch_status`
and `albums` (tests/test_architecture.py).

What stays outside, and why: the stored side (indexers/facts.py, fact_rows.py, fact_filters.py,
ocr_rows.py) is storage, the floor below, which reads no file and runs no model; serving's
`folder_sync` (the watcher's polls run on the engine's model thread) and `duplicates_route` (GET
/duplicates) translate the wing for the server, as the CLI's commands do for the terminal, and
import serving's engine, which this floor may not; `serving/reindex_watch.py` and
`retrieval/locations.py` are not the wing (a served collection's `--reindex`, where collections
live). Nothing is re-exported here: `watch_status` stays importable without numpy or FAISS."""
