"""faste_mm.model: the embedding core. items -> serialization -> batching/prefetch -> backbones
-> runner (one layer loop asking the FastE policy, `faste.py`) -> pooling; `embedder.Embedder` is
its facade. Imports nothing from the layers above it (retrieval, tools, integrations, indexers,
datasets, cli)."""
