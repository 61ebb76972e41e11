"""File names in a collection directory that readers without FAISS need (the thin client that
asks a running server): kept apart from `directory`, which imports the FAISS index module."""

SERVER_FILE = "server.json"  # a running `faste-mm serve` announces itself here (faste_mm.serving.discovery)
WATCH_FILE = "watch.json"  # `faste-mm watch` / `serve --watch` write their last poll here (faste_mm.retrieval.library.watching)
