"""faste_mm.retrieval: collections of files searched by meaning. `retriever.Retriever` is the
facade; `ingest` scans folders, plans what to (re-)embed and commits chunks to the collection
(`faste_mm.indexers`); `results` holds the report and hit types."""
