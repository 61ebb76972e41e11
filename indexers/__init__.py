"""faste_mm.indexers: collections on disk and the FAISS indexes derived from them."""
