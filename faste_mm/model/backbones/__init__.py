"""Backbone adapters, one file per model family, and `registry`, the table that maps a HF
`model_type` to its adapter, serializer and FastE defaults."""
