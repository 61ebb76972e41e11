"""MMEB loaders on generated fixtures: layouts, instructions, candidate lists and deduplication,
error messages for missing files / columns / images, and the hub path without a network."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from faste_mm.datasets import download_tasks, hub, load_task, resolve_tasks, task_spec
from faste_mm.datasets.hub import extract_archive
from faste_mm.datasets.mmeb import clean_instruction
from faste_mm.errors import ConfigError, InputError, ModelLoadError

from tests.helpers.eval_fixtures import DOCVQA_ANSWERS, LAYOUTS, MSCOCO_LISTS, NIGHTS_LISTS, mmeb_rows, write_mmeb, write_table


@pytest.fixture(scope="module")
def mmeb_dir(tmp_path_factory) -> Path:
    return write_mmeb(tmp_path_factory.mktemp("mmeb"))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_documented_layout_loads_the_same_task(tmp_path, layout, mmeb_dir):
    data = load_task("nights", write_mmeb(tmp_path, layout))
    reference = load_task("nights", mmeb_dir)
    assert [q.candidates for q in data.queries] == [q.candidates for q in reference.queries]
    assert [c.image.relative_to(tmp_path) for c in data.candidates] == [c.image.relative_to(mmeb_dir) for c in reference.candidates]


def test_mscoco_queries_are_captions_and_candidates_are_unique_images(mmeb_dir):
    data = load_task("MSCOCO_t2i", mmeb_dir)
    assert [q.text for q in data.queries][0] == "a red bus on a street"
    assert all(q.image is None for q in data.queries)
    assert data.queries[0].instruction == "Find me an everyday image that matches the given caption:"
    # 8 distinct images over the 4 lists; each list maps back to its file names, gold first.
    assert len(data.candidates) == 8
    for query, expected in zip(data.queries, MSCOCO_LISTS):
        assert [data.candidates[i].image.name for i in query.candidates] == [f"coco_{k}.jpg" for k in expected]
    assert all(c.text is None for c in data.candidates)  # tgt_text is ignored for image candidates


def test_docvqa_query_is_page_plus_question_and_answers_are_deduplicated_by_string(mmeb_dir):
    data = load_task("docvqa", mmeb_dir)
    query = data.queries[0]
    assert query.instruction == "Represent the given image with the following question:"  # marker removed
    assert query.text == "What is the date?" and query.image.name == "page_0.png"
    unique = list(dict.fromkeys(a for answers in DOCVQA_ANSWERS for a in answers))
    assert [c.text for c in data.candidates] == unique
    assert all(c.image is None for c in data.candidates)
    # The repeated "March 3, 1998" in query 0's list is one candidate, listed twice.
    assert query.candidates[0] == query.candidates[2]
    for q, answers in zip(data.queries, DOCVQA_ANSWERS):
        assert [data.candidates[i].text for i in q.candidates] == answers


def test_nights_query_is_an_image_with_no_text(mmeb_dir):
    data = load_task("nights", mmeb_dir)
    assert all(q.text is None and q.image is not None for q in data.queries)
    assert data.queries[0].instruction == "Find a day-to-day image that looks similar to the provided image."
    item = data.query_items()[1]
    assert item.text is None and item.instruction == data.queries[1].instruction
    assert [data.candidates[i].image.name for i in data.queries[2].candidates] == [f"n_{k}.png" for k in NIGHTS_LISTS[2]]
    assert all(item.instruction is None for item in data.candidate_items())  # default instruction


def test_limit_keeps_the_first_queries_and_only_their_candidates(mmeb_dir):
    data = load_task("mscoco", mmeb_dir, limit=1)
    assert len(data.queries) == 1 and len(data.candidates) == 5


def test_instruction_marker_is_removed_and_whitespace_stripped():
    assert clean_instruction("<|image_1|>\nRepresent the given image.") == "Represent the given image."
    assert clean_instruction(None) == ""


def test_task_names_and_all():
    assert [s.subset for s in resolve_tasks("all")] == ["MSCOCO_t2i", "DocVQA", "NIGHTS"]
    assert task_spec("DOCVQA").key == "docvqa"
    with pytest.raises(ConfigError, match="mscoco, docvqa, nights"):
        task_spec("flickr")


def test_missing_task_file_names_the_directory_and_expected_files(tmp_path):
    with pytest.raises(InputError, match=r"no file for task NIGHTS; expected NIGHTS\.parquet"):
        load_task("nights", tmp_path)
    with pytest.raises(InputError, match="data directory not found"):
        load_task("nights", tmp_path / "absent")


@pytest.mark.parametrize("suffix, message", [(".parquet", r"missing column\(s\) tgt_img_path"), (".jsonl", r"\(line 1\): missing field\(s\) tgt_img_path")])
def test_missing_column_is_named_with_the_file(tmp_path, suffix, message):
    rows = [{k: v for k, v in row.items() if k != "tgt_img_path"} for row in mmeb_rows(tmp_path / "images")["NIGHTS"]]
    path = write_table(tmp_path / f"NIGHTS{suffix}", rows)
    with pytest.raises(InputError, match=message) as error:
        load_task("nights", tmp_path)
    assert str(path) in str(error.value)


def _drop_qry_text(row):
    del row["qry_text"]
    return row


# Each breaks the third row (of four) of NIGHTS.jsonl in one way: (break, field named, what is wrong).
BAD_ROWS = {
    "missing field": (_drop_qry_text, "qry_text", "missing field(s) qry_text"),
    "number for a string": (lambda row: {**row, "qry_inst": 7}, "qry_inst", "must be a string, got int"),
    "string for a list": (lambda row: {**row, "tgt_img_path": "NIGHTS/n_1.png"}, "tgt_img_path", "must be a list of candidates, got str"),
    "number in a list": (lambda row: {**row, "tgt_img_path": [*row["tgt_img_path"][:3], 5, row["tgt_img_path"][4]]}, "tgt_img_path[3]", "must be a string, got int"),
    "not an object": (lambda row: ["qry_inst", "qry_text"], None, "expected one row (a JSON object), got list"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_a_bad_jsonl_row_in_the_middle_is_named_by_file_line_and_field(tmp_path, case):
    breaks, field, problem = BAD_ROWS[case]
    rows = mmeb_rows(tmp_path / "images")["NIGHTS"]
    rows[2] = breaks(rows[2])
    lines = [json.dumps(row) for row in rows]
    path = tmp_path / "NIGHTS.jsonl"
    path.write_text(lines[0] + "\n\n" + "\n".join(lines[1:]) + "\n")  # a blank line: rows[2] is on line 4
    with pytest.raises(InputError) as error:
        load_task("nights", tmp_path)
    message = str(error.value)
    assert message.startswith(f"{path} (line 4): ")
    assert problem in message and (field is None or f"field {field} " in message or f"field(s) {field}" in message)
    assert "fix or remove the row" in message


def test_rows_past_the_limit_are_validated_too(tmp_path):
    rows = mmeb_rows(tmp_path / "images")["NIGHTS"]
    rows[3]["tgt_text"] = None
    write_table(tmp_path / "NIGHTS.jsonl", rows)
    with pytest.raises(InputError, match=r"NIGHTS\.jsonl \(line 4\): field tgt_text must be a list"):
        load_task("nights", tmp_path, limit=1)


def test_a_null_list_in_a_parquet_row_is_named_by_row(tmp_path):
    rows = mmeb_rows(tmp_path / "images")["NIGHTS"]
    rows[2]["tgt_img_path"] = None
    path = write_table(tmp_path / "NIGHTS.parquet", rows)
    with pytest.raises(InputError, match=r"\(row 2\): field tgt_img_path must be a list of candidates, got NoneType") as error:
        load_task("nights", tmp_path)
    assert str(path) in str(error.value)


def test_a_bad_row_in_a_later_shard_names_that_shard(tmp_path):
    rows = mmeb_rows(tmp_path / "images")["MSCOCO_t2i"]
    rows[3]["qry_text"] = ""
    write_table(tmp_path / "MSCOCO_t2i" / "test-00000-of-00002.parquet", rows[:2])
    second = write_table(tmp_path / "MSCOCO_t2i" / "test-00001-of-00002.parquet", rows[2:])
    with pytest.raises(InputError, match=r"\(row 1\): qry_text: empty, but this task needs a text") as error:
        load_task("mscoco", tmp_path)
    assert str(error.value).startswith(str(second))


def test_missing_image_is_reported_with_the_image_root(tmp_path):
    write_mmeb(tmp_path)
    (tmp_path / "images" / "NIGHTS" / "n_3.png").unlink()
    with pytest.raises(InputError, match=r"1 of 10 image\(s\) not found .*n_3\.png.*--image-root"):
        load_task("nights", tmp_path)


def test_candidates_must_be_lists(tmp_path):
    rows = mmeb_rows(tmp_path / "images")["DocVQA"]
    rows[1]["tgt_text"] = "42"
    write_table(tmp_path / "DocVQA.jsonl", rows)
    with pytest.raises(InputError, match=r"DocVQA\.jsonl \(line 2\): field tgt_text must be a list of candidates, got str '42'"):
        load_task("docvqa", tmp_path)


def test_image_root_is_found_inside_an_extracted_archive_folder(tmp_path):
    write_mmeb(tmp_path, image_dir="images/eval_images")
    data = load_task("nights", tmp_path)
    assert data.candidates[0].image.is_file() and data.candidates[0].image.parent.parent.name == "eval_images"
    assert load_task("nights", tmp_path, image_root=tmp_path / "images" / "eval_images").candidates == data.candidates


def _hub_offline(monkeypatch, error: Exception) -> None:
    """The hub's file listing (faste-mm's one request before any download) fails with `error`,
    as the hub client's does without a network."""

    def offline():
        raise error

    monkeypatch.setattr(hub, "_data_repo_files", offline)


def test_hub_download_offline_raises_model_load_error_naming_the_data_set(tmp_path, monkeypatch):
    _hub_offline(monkeypatch, ConnectionError("network unreachable"))
    with pytest.raises(ModelLoadError, match="ziyjiang/MMEB_Test_Instruct.*--data DIR"):
        download_tasks(resolve_tasks("nights"), tmp_path)


def test_hub_download_reuses_cached_files_when_offline(tmp_path, monkeypatch):
    _hub_offline(monkeypatch, OSError("offline"))
    write_mmeb(tmp_path, "hub-shards")
    (tmp_path / "images" / ".complete").write_text("ok\n")  # archive already extracted
    assert download_tasks(resolve_tasks("all"), tmp_path) == tmp_path
    assert len(load_task("docvqa", tmp_path).queries) == 4


def test_archive_extraction_is_complete_or_absent(tmp_path):
    archive = tmp_path / "images.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        payload = b"not really a jpeg"
        info = tarfile.TarInfo("eval_images/NIGHTS/a.png")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    extract_archive(archive, tmp_path / "images")
    assert (tmp_path / "images" / "eval_images" / "NIGHTS" / "a.png").is_file()
    assert (tmp_path / "images" / ".complete").is_file() and not (tmp_path / "images.partial").exists()
    (tmp_path / "broken.tar.gz").write_bytes(b"garbage")
    with pytest.raises(InputError, match="cannot extract"):
        extract_archive(tmp_path / "broken.tar.gz", tmp_path / "other")
    assert not (tmp_path / "other").exists() and not (tmp_path / "other.partial").exists()
