"""The lexical index (FTS5 in meta.sqlite) and hybrid search: kept in step with the rows through
adds, replacements, removals, compaction and migration (crashes: test_sqlite_indexes_crash.py);
user queries never raise; storage only (vectors seeded with numpy, no model)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from faste_mm.errors import InputError
from faste_mm.indexers import Collection, ItemRecord, Manifest, SearchFilter, search

from tests.helpers.old_schemas import downgrade

D = 8
TEXTS = ["invoice for Müller GmbH", "the quick brown fox", "payment reminder", "fox hunting season",
         "annual report 2024", "receipt", "ein Bericht über Füchse", "日本語のテキスト"]


def unit(rng, n):
    x = rng.standard_normal((n, D)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def records(texts, prefix="/docs", start=0):
    return [ItemRecord(uri=f"{prefix}/INV-2024-{start + i:03d}.pdf", modality="page", page=0, text=t,
                       metadata={"client": "acme" if i % 2 else "zeta", "year": 2024})
            for i, t in enumerate(texts)]


def lexical(col, text, k=10, **kw):
    return [int(i) for i in col.find(k, texts=[text], mode="lexical", **kw).ids[0] if i >= 0]


@pytest.fixture
def col(tmp_path):
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=D)) as col:
        col.add(unit(np.random.default_rng(0), len(TEXTS)), records(TEXTS))
        yield col


def test_lexical_search_finds_text_names_and_metadata_like_a_naive_word_match(col):
    assert lexical(col, "fox") == [1, 3] or sorted(lexical(col, "fox")) == [1, 3]
    assert lexical(col, "muller") == [0]  # diacritics folded
    assert lexical(col, "INV-2024-004") == [4]  # a file name as a phrase of its path words
    assert sorted(lexical(col, "acme")) == [1, 3, 5, 7]  # a metadata value
    assert lexical(col, "füchse") == [6]
    assert lexical(col, "fox", where=SearchFilter(where={"client": "zeta"})) == []  # filters apply
    assert lexical(col, "fox", where=SearchFilter(where={"client": "acme"}), k=1) in ([1], [3])


@pytest.mark.parametrize("query", ['"unbalanced', "fox*", "a:b", "NOT", "(", ")", "AND OR", "'", '""', "*",
                                   "日本語", "NEAR(fox", "^fox", "-", "\x00", "🦊", "fox\"*:()"])
def test_user_queries_with_fts_syntax_never_raise(col, query):
    lexical(col, query)  # plain words: never an FTS error
    found = col.find(3, queries=unit(np.random.default_rng(1), 1), texts=[query], mode="hybrid")
    assert (found.ids[0] >= 0).sum() == 3  # the dense side still answers


def test_lexical_syntax_is_passed_through_and_a_bad_expression_is_an_input_error(col):
    assert lexical(col, "fox NOT hunting", lexical_syntax=True) == [1]
    assert lexical(col, "repor*", lexical_syntax=True) == [4]
    with pytest.raises(InputError, match="not a valid FTS5 expression"):
        lexical(col, '"unbalanced', lexical_syntax=True)


def test_the_lexical_index_follows_adds_replacements_removals_and_compaction(col):
    rng = np.random.default_rng(2)
    live = lambda: sorted(col.live_ids(range(100)))  # noqa: E731
    assert col.read(lambda rows: rows.lexical_ids()) == live()
    new = col.add(unit(rng, 1), [ItemRecord(uri="/docs/INV-2024-001.pdf", modality="page", page=0, text="zebra")])
    assert lexical(col, "fox") == [3] and lexical(col, "zebra") == new.tolist()  # replaced: old text gone
    col.add_failures([ItemRecord(uri="/docs/broken.pdf", modality="page", error="bad file", text="broken")])
    assert lexical(col, "broken") == []  # failures are not searchable
    col.delete(uris=["/docs/INV-2024-004.pdf"])
    col.delete([0])
    assert lexical(col, "report") == [] and lexical(col, "muller") == []
    assert col.read(lambda rows: rows.lexical_ids()) == live()
    col.compact()
    assert col.read(lambda rows: rows.lexical_ids()) == live() and lexical(col, "zebra") == new.tolist()


def test_hybrid_fuses_both_sides_and_says_which_found_each_hit(col):
    vectors = col.vectors(range(len(TEXTS)))
    found = col.find(3, queries=vectors[5:6], texts=["fox"], mode="hybrid")
    dense = col.find(search.hybrid_depth(3), queries=vectors[5:6], mode="dense").ids
    words = col.find(search.hybrid_depth(3), texts=["fox"], mode="lexical").ids
    _, want, sources = search.fuse_rrf([dense, words], 3)
    assert found.ids.tolist() == want.tolist() and found.sources.tolist() == sources.tolist()
    assert found.ids[0, 0] in (1, 3, 5) and set(found.sources[0]) <= {1, 2, 3}
    by_id = dict(zip(found.ids[0].tolist(), found.sources[0].tolist()))
    assert by_id.get(1, 3) & search.FOUND_LEXICAL and by_id.get(5, 1) & search.FOUND_DENSE


def test_a_schema_3_collection_gets_names_and_metadata_indexed_on_the_next_write(tmp_path):
    root = tmp_path / "c"
    with Collection.create(root, Manifest(model_id="m", dim=D)) as col:
        col.add(unit(np.random.default_rng(3), 3), records(["alpha", "beta", "gamma"]))
    downgrade(root, 3)
    with Collection.open(root) as reader:  # readable as it is, but it has no lexical index yet
        with pytest.raises(Exception, match="predates lexical search"):
            lexical(reader, "acme")
    with Collection.open(root, writable=True) as col:
        assert sorted(lexical(col, "acme")) == [1] and lexical(col, "INV-2024-002") == [2]
        assert lexical(col, "alpha") == []  # the text comes back with rebuild-index (re-read files)
        assert [r.id for r in col.read(lambda rows: rows.items_without_text())] == [0, 1, 2]
        col.set_texts([(0, "alpha"), (2, "gamma")])
        assert lexical(col, "alpha") == [0] and [r.id for r in col.read(lambda rows: rows.items_without_text())] == [1]


def text_pdf(path, texts: list[str]):
    """A PDF whose pages hold these strings as a text layer (PDFium's own text objects)."""
    import pypdfium2 as pdfium
    import pypdfium2.raw as raw

    pdf = pdfium.PdfDocument.new()
    for text in texts:
        page = pdf.new_page(300, 200)
        obj = raw.FPDFPageObj_NewTextObj(pdf.raw, b"Helvetica", 12.0)
        buffer = ctypes.create_string_buffer((text + "\x00").encode("utf-16-le"))
        raw.FPDFText_SetText(obj, ctypes.cast(buffer, ctypes.POINTER(raw.FPDF_WCHAR)))
        raw.FPDFPage_InsertObject(page.raw, obj)
        raw.FPDFPage_GenerateContent(page.raw)
    pdf.save(str(path))
    pdf.close()
    return path


def test_item_text_reads_text_items_and_the_text_layer_of_pdf_pages(tmp_path):
    from faste_mm.model.items import Item
    from faste_mm.retrieval.lexical import item_text, source_text

    pdf = text_pdf(tmp_path / "doc.pdf", ["invoice number INV-77", "second page about foxes"])
    assert item_text(Item(image=str(pdf), page=2)) == "second page about foxes"
    assert source_text(pdf, 1) == "invoice number INV-77"
    assert item_text(Item(text="a caption", image=str(pdf), page=1)) == "a caption"
    assert source_text(pdf, 9) is None  # no such page: no text, never an error


def test_rebuild_index_gives_older_items_the_text_of_their_files(tmp_path):
    from faste_mm.retrieval.maintenance import rebuild_index

    root, note = tmp_path / "c", tmp_path / "note.txt"
    note.write_text("a red bicycle leaning on a wall", encoding="utf-8")
    pdf = text_pdf(tmp_path / "doc.pdf", ["invoice number INV-77", "second page about foxes"])
    rows = [ItemRecord(uri=str(note), modality="text", size=note.stat().st_size),
            ItemRecord(uri=str(pdf), modality="page", page=2, size=pdf.stat().st_size)]
    with Collection.create(root, Manifest(model_id="m", dim=D)) as col:
        col.add(unit(np.random.default_rng(5), 2), rows)  # stored without text, as before schema 4
        assert lexical(col, "bicycle") == [] and lexical(col, "foxes") == []
    rebuild_index(root)
    with Collection.open(root) as col:
        assert lexical(col, "bicycle") == [0] and lexical(col, "foxes") == [1]


def test_cli_lexical_search_needs_no_model_and_says_which_side_found_each_hit(tmp_path):
    import json

    from typer.testing import CliRunner

    from faste_mm.cli.app import app

    root = tmp_path / "c"
    with Collection.create(root, Manifest(model_id="no-such/model", dim=D)) as col:  # never loadable
        col.add(unit(np.random.default_rng(6), len(TEXTS)), records(TEXTS))
    result = CliRunner().invoke(app, ["search", 'fox "hunting*', "--mode", "lexical", "-c", str(root),
                                      "--format", "json", "--where", "client=acme"])
    assert result.exit_code == 0, (result.stderr[-2000:], result.exception)
    payload = json.loads(result.stdout)
    assert payload["mode"] == "lexical"
    assert [h["uri"] for h in payload["hits"]] == ["/docs/INV-2024-003.pdf", "/docs/INV-2024-001.pdf"]
    assert {h["found_by"] for h in payload["hits"]} == {"lexical"}
    bad = CliRunner().invoke(app, ["search", "fox", "--mode", "fuzzy", "-c", str(root)])
    assert bad.exit_code == 2 and "--mode 'fuzzy' is not one of dense, lexical, hybrid" in bad.stderr


def test_hybrid_rescores_the_deep_dense_list_only_k_x_rescore_rows_and_fuses_the_same(tmp_path, monkeypatch):
    from faste_mm.indexers import collection_search

    assert collection_search.fusion_rescore(None, 10, 50, "BFlat", "float16") == 4  # 20 x 10 / 50
    assert collection_search.fusion_rescore(3, 10, 50, "BFlat", "float16") == 1
    assert collection_search.fusion_rescore(0, 10, 50, "BFlat", "float16") == 0  # no rescoring stays none
    assert collection_search.fusion_rescore(None, 10, 50, "Flat", "float16") is None  # nothing to rescore
    rng = np.random.default_rng(7)
    centres = rng.standard_normal((20, 64)).astype(np.float32)
    x = centres[rng.integers(0, 20, 1500)] + 0.6 * rng.standard_normal((1500, 64)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
    texts = [" ".join(words[j] for j in rng.integers(0, 6, 3)) for _ in range(1500)]
    # What each side is asked for and hands back: (side, depth asked, ids shape), and the
    # candidates [q, c] each exact rescoring reads from the stored vectors.
    asked, rescored = [], []
    dense_hits, lexical_hits, rescore = collection_search.dense_hits, collection_search.lexical_hits, search.rescore

    def spy_dense(derived, store, queries, k, *args):
        hits = dense_hits(derived, store, queries, k, *args)
        asked.append(("dense", k, hits[1].shape))
        return hits

    def spy_lexical(store, root, texts, k, *args):
        hits = lexical_hits(store, root, texts, k, *args)
        asked.append(("lexical", k, hits[1].shape))
        return hits

    def spy_rescore(queries, candidates, k, fetch):
        rescored.append(candidates.shape)
        return rescore(queries, candidates, k, fetch)

    monkeypatch.setattr(collection_search, "dense_hits", spy_dense)
    monkeypatch.setattr(collection_search, "lexical_hits", spy_lexical)
    monkeypatch.setattr(search, "rescore", spy_rescore)
    k, depth, n_queries = 5, search.hybrid_depth(5), 12
    binary_rescore = search.DEFAULT_RESCORE["binary"]  # R: the binary index's candidates per hit
    with Collection.create(tmp_path / "b", Manifest(model_id="m", dim=64, vectors="binary")) as col:
        col.add(x, records(texts))
        queries, query_texts = x[:n_queries] + 0.05, [texts[i].split()[0] for i in range(n_queries)]
        found = col.find(k, queries=queries, texts=query_texts, mode="hybrid")
        # Both sides fetched `depth` deep, the dense list rescored from k x R candidates a query,
        # as many as a dense top-k reads (not depth x R).
        assert sorted(asked) == [("dense", depth, (n_queries, depth)), ("lexical", depth, (n_queries, depth))]
        assert rescored == [(n_queries, k * binary_rescore)]
        asked.clear(), rescored.clear()
        deep = col.find(depth, queries=queries, mode="dense").ids  # rescored depth x R deep
        assert rescored == [(n_queries, depth * binary_rescore)]
        lexical_ids = col.find(depth, texts=query_texts, mode="lexical").ids
        _, want, sources = search.fuse_rrf([deep, lexical_ids], k)
        assert found.ids.tolist() == want.tolist() and found.sources.tolist() == sources.tolist()
