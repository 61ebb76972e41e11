"""Queries in other languages against an English-captioned collection (#35 item 7), on the tiny
model with the real Qwen tokenizer: the block docs/photos.md shows runs as written, every query
tokenizes losslessly, and dense, hybrid and lexical searches answer. Mechanics only: the tiny
model's random weights say nothing about quality."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from faste_mm import Embedder, Item, Retriever
from faste_mm.tools.shapes import qwen_tokenizer_dir
from tests.helpers.inputs import tiny_vl_dir

DOC = Path(__file__).resolve().parents[1] / "docs" / "photos.md"
CAPTIONS = ["a red bicycle leaning against a wall", "a cat sleeping on a sofa", "sunset over the sea at the beach",
            "a bowl of ramen on a wooden table"]


def doc_block() -> str:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(r"<!-- skip: tests/test_many_languages.py runs this block[^\n]*-->\n```python\n(.*?)```", text, re.S)
    assert match, "docs/photos.md lost its tested block"
    return match[1]


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    embedder = Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu")
    retriever = Retriever(embedder, collection=tmp_path_factory.mktemp("langs") / "c", r_max=0.0)
    retriever.add([Item(text=caption) for caption in CAPTIONS], uris=[f"caption:{i}" for i in range(len(CAPTIONS))])
    return retriever


def test_the_documented_block_runs_and_every_language_gets_hits(retriever, capsys):
    exec(compile(doc_block(), str(DOC), "exec"), {"retriever": retriever})
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["German", "Japanese", "Arabic"]
    assert all(line.count("caption:") == 3 for line in lines)


def test_the_real_qwen_tokenizer_round_trips_each_documented_query():
    namespace: dict = {}
    exec(compile(doc_block().split("for language")[0], str(DOC), "exec"), namespace)
    tokenizer = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
    for language, query in namespace["queries"].items():
        ids = tokenizer(query, add_special_tokens=False)["input_ids"]
        assert tokenizer.unk_token_id not in ids, language  # byte-level BPE: no unknown token
        assert tokenizer.decode(ids) == query, language
        assert len(ids) < 4 * len(query.split()) + 8, language  # whole words and pieces, not one token per byte


@pytest.mark.parametrize("mode", ["hybrid", "lexical"])
def test_non_latin_queries_run_in_hybrid_and_lexical_modes(retriever, mode):
    for query in ("壁に立てかけた赤い自転車", "دراجة حمراء", "Fahrrad"):
        hits = retriever.search(query, k=2, mode=mode)
        assert len(hits) == (2 if mode == "hybrid" else 0)  # no shared word with an English caption
