"""Generated MMEB_Test_Instruct fixtures: the three tasks, 4 queries x 5 candidates each, with
PIL-written images, in any of the local layouts `faste_mm.datasets.mmeb` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

MSCOCO_INST = "Find me an everyday image that matches the given caption:"
DOCVQA_INST = "<|image_1|>\nRepresent the given image with the following question:"
NIGHTS_INST = "<|image_1|>\nFind a day-to-day image that looks similar to the provided image."
IMAGE_TGT_INST = "<|image_1|>\nRepresent the given image."

# Candidate lists overlap between queries, so unique candidates < 4 x 5.
MSCOCO_LISTS = [[0, 1, 2, 3, 4], [1, 0, 2, 5, 6], [2, 3, 0, 1, 7], [3, 4, 5, 6, 7]]
NIGHTS_LISTS = [[0, 1, 2, 3, 4], [1, 2, 3, 4, 5], [2, 0, 5, 1, 3], [3, 5, 4, 0, 1]]
# DocVQA answers: "March 3, 1998" appears twice in query 0's list (deduplicated by string).
DOCVQA_ANSWERS = [
    ["March 3, 1998", "$12.50", "March 3, 1998", "Table 2", "ITC Limited"],
    ["$12.50", "42", "Table 2", "page 7", "ITC Limited"],
    ["Table 2", "42", "March 3, 1998", "yes", "$12.50"],
    ["ITC Limited", "page 7", "42", "no", "yes"],
]
CAPTIONS = ["a red bus on a street", "two dogs in the snow", "a plate of pasta", "a man riding a green bike"]
QUESTIONS = ["What is the date?", "What is the price?", "Which table?", "Who is the company?"]


def _image(path: Path, color: tuple[int, int, int], size: tuple[int, int]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGB", size, color)
    # A second colour block so images are not flat (different visual tokens differ).
    image.paste((255 - color[0], color[2], color[1]), (0, 0, size[0] // 2, size[1] // 3))
    image.save(path)
    return path.name


def mmeb_rows(image_root: Path) -> dict[str, list[dict]]:
    """Rows of the three subsets; images are written under `image_root`."""
    coco = [f"MSCOCO_t2i/{_image(image_root / 'MSCOCO_t2i' / f'coco_{k}.jpg', (30 * k, 200 - 20 * k, 90), (128, 96))}" for k in range(8)]
    pages = [f"DocVQA/{_image(image_root / 'DocVQA' / f'page_{k}.png', (240, 240 - 30 * k, 220), (96, 128))}" for k in range(4)]
    nights = [f"NIGHTS/{_image(image_root / 'NIGHTS' / f'n_{k}.png', (40 * k, 60, 250 - 40 * k), (96, 96))}" for k in range(6)]
    nights_q = [f"NIGHTS/{_image(image_root / 'NIGHTS' / f'q_{k}.png', (40 * k + 5, 65, 245 - 40 * k), (96, 96))}" for k in range(4)]
    return {
        "MSCOCO_t2i": [
            {
                "qry_inst": MSCOCO_INST,
                "qry_text": CAPTIONS[i],
                "qry_img_path": "",
                "tgt_inst": IMAGE_TGT_INST,
                "tgt_text": [IMAGE_TGT_INST] * 5,
                "tgt_img_path": [coco[k] for k in MSCOCO_LISTS[i]],
            }
            for i in range(4)
        ],
        "DocVQA": [
            {
                "qry_inst": DOCVQA_INST,
                "qry_text": QUESTIONS[i],
                "qry_img_path": pages[i],
                "tgt_inst": "",
                "tgt_text": DOCVQA_ANSWERS[i],
                "tgt_img_path": [""] * 5,
            }
            for i in range(4)
        ],
        "NIGHTS": [
            {
                "qry_inst": NIGHTS_INST,
                "qry_text": "",
                "qry_img_path": nights_q[i],
                "tgt_inst": IMAGE_TGT_INST,
                "tgt_text": [""] * 5,
                "tgt_img_path": [nights[k] for k in NIGHTS_LISTS[i]],
            }
            for i in range(4)
        ],
    }


def write_table(path: Path, rows: list[dict]) -> Path:
    """parquet or jsonl by suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


LAYOUTS = {
    "flat-parquet": "{subset}.parquet",
    "flat-jsonl": "{subset}.jsonl",
    "folder-test": "{subset}/test.parquet",
    "hub-shards": "{subset}/test-00000-of-00001.parquet",
}


def write_mmeb(root: Path, layout: str = "flat-parquet", image_dir: str = "images") -> Path:
    """The three subsets under `root` in `layout` (a LAYOUTS key), images under root/image_dir."""
    for subset, rows in mmeb_rows(root / image_dir).items():
        write_table(root / LAYOUTS[layout].format(subset=subset), rows)
    return root


@pytest.fixture(scope="session")
def eval_model_dir(tmp_path_factory) -> Path:
    """The tiny Qwen3-VL model, built once per run even when several modules import this fixture."""
    from tests.helpers.tiny_models import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.getbasetemp(), "qwen3_vl")


@pytest.fixture(scope="session")
def eval_data_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.getbasetemp() / "eval_mmeb"
    if not path.is_dir():
        write_mmeb(path)
    return path
