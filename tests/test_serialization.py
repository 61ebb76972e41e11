"""Official Qwen3-VL-Embedding serialization: prompt strings, instruction rule, real token ids."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from faste_mm import Item
from faste_mm.model.serialization import normalize_instruction

VISION_START, IMAGE_PAD, VISION_END, IM_START, IM_END = 151652, 151655, 151653, 151644, 151645
NEWLINE, ASSISTANT = 198, 77091


def _prompt(user: str, instruction: str = "Represent the user's input.") -> str:
    return (
        f"<|im_start|>system\n{instruction}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    "raw, expected",
    [
        (None, "Represent the user's input."),
        ("", "Represent the user's input."),
        ("  Find me an everyday image that matches the given caption  ", "Find me an everyday image that matches the given caption."),
        ("Represent the given image with the following question:", "Represent the given image with the following question:"),
        ("Is this relevant?", "Is this relevant?"),
        ("找到相关文档。", "找到相关文档。"),
        ("Retrieve passages (English)", "Retrieve passages (English)"),
    ],
)
def test_instruction_gets_a_period_unless_it_ends_in_unicode_punctuation(raw, expected):
    assert normalize_instruction(raw) == expected


def test_rendered_prompts_follow_the_official_format(vl_embedder, image_dir):
    render = vl_embedder.serializer.render_prompt
    image_tag = "<|vision_start|><|image_pad|><|vision_end|>"
    assert render(Item(text="a red bicycle"), None) == _prompt("a red bicycle")
    assert render(Item(image=image_dir / "red.png"), None) == _prompt(image_tag)
    assert render(Item(text="what is shown?", image=image_dir / "red.png"), "Answer") == _prompt(
        image_tag + "what is shown?", "Answer."
    )
    assert render(Item(image=image_dir / "doc.pdf", page=2), None) == _prompt(image_tag)
    assert render(Item(), None) == _prompt("NULL")
    assert render(Item(text=""), None) == _prompt("NULL")


def test_text_item_token_ids_end_with_the_generation_prompt(vl_embedder):
    ids = vl_embedder.serializer(Item(text="hello"), None).input_ids.tolist()
    assert ids[0] == IM_START
    assert ids[-5:] == [IM_END, NEWLINE, IM_START, ASSISTANT, NEWLINE]
    assert IMAGE_PAD not in ids


@pytest.mark.parametrize(
    "size, pads",
    [
        ((100, 70), 6),  # smart_resize -> 96x64 (multiples of 32) -> (96/32)*(64/32) = 6 tokens
        ((1, 1), 4),  # upscaled to min_pixels 4096 -> 64x64 -> 4 tokens
        ((2000, 1500), 1728),  # 3.0 Mpx > max: beta = sqrt(3e6/1843200), floor to 1536x1152 -> 48*36
    ],
)
def test_image_pad_count_follows_smart_resize_with_factor_32(vl_embedder, tmp_path, size, pads):
    path = tmp_path / "img.png"
    Image.new("RGB", size, (10, 20, 30)).save(path)
    serialized = vl_embedder.serializer(Item(image=path, text="caption"), None)
    ids = serialized.input_ids.tolist()
    start = ids.index(VISION_START)
    assert ids[start + 1 : start + 1 + pads] == [IMAGE_PAD] * pads
    assert ids[start + 1 + pads] == VISION_END
    assert ids.count(IMAGE_PAD) == pads
    assert serialized.mm_token_type_ids.sum().item() == pads
    assert int(serialized.image_grid_thw.prod()) == pads * 4


def test_rgba_is_pasted_on_white(vl_embedder, tmp_path):
    path = tmp_path / "clear.png"
    Image.new("RGBA", (64, 64), (255, 0, 0, 0)).save(path)
    assert vl_embedder.serializer.prepare_image(Item(image=path)).getpixel((5, 5)) == (255, 255, 255)


def test_pdf_expands_to_one_row_per_page_in_order(vl_embedder, image_dir):
    res = vl_embedder.encode(["before", image_dir / "doc.pdf", "after"])
    assert [item.page for item in res.items] == [None, 1, 2, None]
    assert res.sources == [0, 1, 1, 2]
    assert res.ok.all()


def test_long_text_is_truncated_on_the_right_at_max_length(model_dirs):
    from faste_mm import Embedder, SerializerConfig

    embedder = Embedder.from_pretrained(str(model_dirs["qwen3_vl"]), device="cpu", serializer=SerializerConfig(max_length=32))
    serialized = embedder.serializer(Item(text="word " * 100), None)
    assert serialized.length == 32 and serialized.truncated


@pytest.mark.parametrize(
    "family, instruction, prompt",
    [
        ("qwen3", None, "a document"),
        ("qwen3", "Find it", "Instruct: Find it\nQuery:a document"),
        ("mistral", "Find it", "Instruct: Find it\nQuery: a document"),
    ],
)
def test_text_models_use_their_official_templates_and_eos_readout(text_embedders, family, instruction, prompt):
    embedder = text_embedders[family]
    tokenizer = embedder.serializer.tokenizer
    ids = embedder.serializer(Item(text="a document"), instruction).input_ids.tolist()
    assert ids[-1] == tokenizer.eos_token_id
    assert ids[:-1] == tokenizer(prompt)["input_ids"]


def test_queries_of_text_models_default_to_the_web_search_task(text_embedders):
    embedder = text_embedders["qwen3"]
    query = embedder.encode_queries(["capital of France"]).embeddings
    explicit = embedder.encode(
        ["capital of France"], instruction="Given a web search query, retrieve relevant passages that answer the query"
    ).embeddings
    assert (query == explicit).all()
    assert not (query == embedder.encode_documents(["capital of France"]).embeddings).all()


def test_with_serializer_shares_weights_and_changes_the_pixel_cap(vl_embedder, tmp_path):
    from faste_mm import SerializerConfig

    Image.new("RGB", (640, 480), (1, 2, 3)).save(tmp_path / "big.png")
    small = vl_embedder.with_serializer(SerializerConfig(max_pixels=64 * 64))
    assert small.backbone is vl_embedder.backbone
    pads = small.serializer(Item(image=tmp_path / "big.png"), None).input_ids.tolist().count(IMAGE_PAD)
    # 640x480 under a 4096 px cap: beta = sqrt(307200 / 4096) = 8.66 -> 32x64 -> 1*2 tokens; uncapped: 20*15
    assert pads == 2 and vl_embedder.serializer(Item(image=tmp_path / "big.png"), None).input_ids.tolist().count(IMAGE_PAD) == 300


def test_eos_readout_is_appended_once_even_if_the_tokenizer_adds_it():
    from faste_mm.model.serialization import TextPrompt, TextSerializer

    class AppendsEos:  # like the published Qwen3-Embedding tokenizer's post-processor
        eos_token_id = 2

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": [1] + [10 + len(w) for w in text.split()] + [2]}

    serializer = TextSerializer(AppendsEos(), TextPrompt(readout="eos"), max_length=4)
    assert serializer(Item(text="a bb"), None).input_ids.tolist() == [1, 11, 12, 2]
    truncated = serializer(Item(text="a bb ccc dddd"), None)
    assert truncated.input_ids.tolist() == [1, 11, 12, 2] and truncated.truncated


def test_mrope_positions_from_the_workers_equal_get_rope_index_on_the_batch(vl_embedder, mixed_items):
    """Positions are computed per item in the preprocessing workers; collated, they must equal
    the model's own get_rope_index over the padded batch (text-only rows included)."""
    from faste_mm.model.batching import collate
    from faste_mm.model.items import as_item

    backbone = vl_embedder.backbone
    serialized = [backbone.with_positions(vl_embedder.serializer(as_item(x, i), None)) for i, x in enumerate(mixed_items)]
    assert any(s.position_ids is None for s in serialized) and any(s.position_ids is not None for s in serialized)
    batch = collate(serialized, list(range(len(serialized))), vl_embedder.loaded.pad_token_id)
    expected, _ = backbone.model.get_rope_index(
        batch.input_ids, mm_token_type_ids=batch.mm_token_type_ids, image_grid_thw=batch.image_grid_thw,
        attention_mask=batch.valid.long(),
    )
    assert batch.position_ids.shape == expected.shape
    assert torch.equal(batch.position_ids[:, batch.valid], expected[:, batch.valid])
