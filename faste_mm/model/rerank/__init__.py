"""faste_mm.model.rerank: the reranker wing, scoring (query, document) pairs with the embedding
core's stages. `reranker.Reranker` is its facade: `loading` reads a reranker checkpoint (the
decoder's adapter + the score direction W[yes] - W[no]); `pair_format` writes each pair in the
official reranker format and marks the protected query span; `policy` holds `ProtectedFastE`
(`protect="query"`) and the explain probe; `prefix_reuse` runs a query's shared prefix once per
query; `tower_cache` (vision tower features) and `resized_images` (resized files), both bounded by
`bytes_lru.BytesLRU`, keep a candidate's work across queries; `explain` maps the readout attention
back to patches and text spans; `results` is what a call hands back (`RerankResult`, `Ranking`,
`RerankStats`). It imports the core (items, serialization, batching, runner, faste, backbones);
the core never imports it (tests/test_architecture.py)."""
