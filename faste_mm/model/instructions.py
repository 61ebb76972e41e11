"""The official Qwen3-VL-Embedding instructions, one constant each: documents are serialized with
the default system turn, queries with the model card's retrieval instruction. The serializer,
`Embedder.encode_queries`, the collection profile and every search front end read them here.
Plain strings: no torch (the CLI and the profile read them at start-up)."""

# The official default system turn (Qwen3-VL-Embedding's `format_model_input`): documents.
DOCUMENT_INSTRUCTION = "Represent the user's input."
# The model card's example retrieval instruction: the query instruction of vision-language models
# (Embedder.encode_queries, Retriever.search, serve, eval); text models use their own default task.
QUERY_INSTRUCTION = "Retrieve images or text relevant to the user's query."
