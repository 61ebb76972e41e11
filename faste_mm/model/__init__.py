"""faste_mm.model: the embedding core. items -> serialization -> batching/prefetch -> backbones
-> runner (one layer loop asking the FastE policy, `faste.py`) -> pooling; `embedder.Embedder` is
its facade. The reranker wing lives in the `rerank` sub-package, which imports the core, never the
reverse. Imports nothing from the layers above it (retrieval, tools, integrations, indexers,
datasets, cli)."""
