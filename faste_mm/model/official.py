"""The official Qwen3-VL-Embedding release's numbers that faste-mm reproduces, as plain data (no
torch): the serializer, the collection profile, `plan` and `bench` read them from here. Where each
comes from: docs/design.md "The official release".
"""

from __future__ import annotations

# The official default system turn (Qwen3-VL-Embedding's `format_model_input`): documents.
DOCUMENT_INSTRUCTION = "Represent the user's input."
# The model card's example retrieval instruction: the query instruction of vision-language models
# (Embedder.encode_queries, Retriever.search, serve, eval); text models use their own default task.
QUERY_INSTRUCTION = "Retrieve images or text relevant to the user's query."
# One merged visual token covers 32 x 32 pixels (patch 16, spatial merge 2): the unit of
# `--visual-tokens`, the friendlier spelling of an image budget in pixels.
PIXELS_PER_VISUAL_TOKEN = 32 * 32
# qwen-vl-utils' image bounds in the official embedder: 4 to 1,800 visual tokens.
OFFICIAL_MIN_PIXELS = 4 * PIXELS_PER_VISUAL_TOKEN  # 4,096 px
OFFICIAL_MAX_PIXELS = 1800 * PIXELS_PER_VISUAL_TOKEN  # 1,843,200 px
# The image budgets `faste-mm plan` and `bench pixels` try by default: the official cap, then
# about a half, a quarter and an eighth of it (980, 490 and 245 visual tokens).
PIXEL_SWEEP = (OFFICIAL_MAX_PIXELS, 980 * PIXELS_PER_VISUAL_TOKEN, 490 * PIXELS_PER_VISUAL_TOKEN,
               245 * PIXELS_PER_VISUAL_TOKEN)
