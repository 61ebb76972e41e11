"""Evaluation data: MMEB tasks in the MMEB_Test_Instruct format, read from a local directory
(parquet or jsonl) and turned into `TaskData` (queries, each with its own candidate list, over
unique candidates) that the protocol embeds and ranks. Hub downloads live in `hub.py`.

Local layout, for each task subset (MSCOCO_t2i, DocVQA, NIGHTS), the first that exists wins:
    DIR/<subset>.parquet | DIR/<subset>.jsonl | DIR/<subset>/test.parquet | DIR/<subset>/test.jsonl
    | DIR/<subset>/*.parquet (all shards, name order; the hub's own layout)
Image paths in qry_img_path / tgt_img_path are relative to the image root: `image_root` if given,
else DIR/images, else DIR, else one folder below DIR/images (the extracted mmeb_v1 archive).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from faste_mm.errors import ConfigError, InputError
from faste_mm.model.items import Item

log = logging.getLogger(__name__)

STRING_COLUMNS = ("qry_inst", "qry_text", "qry_img_path", "tgt_inst")
LIST_COLUMNS = ("tgt_text", "tgt_img_path")  # one entry per candidate
COLUMNS = STRING_COLUMNS + LIST_COLUMNS
IMAGE_MARKER = "<|image_1|>"
# What to do, appended to every row error.
_FIX = (
    f"fix or remove the row (MMEB_Test_Instruct rows have string fields {', '.join(STRING_COLUMNS)} "
    f"and list-of-string fields {', '.join(LIST_COLUMNS)}, one entry per candidate)"
)


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """Which fields of an MMEB row form the query and the candidates of one task."""

    key: str  # CLI name
    subset: str  # MMEB subset / file name
    retrieval: str  # T text, I image (docs/evaluation.md's table)
    query_text: bool
    query_image: bool
    candidate_text: bool
    candidate_image: bool


# The three cross-modal tasks of docs/evaluation.md's table, as docs/design.md "MMEB evaluation data".
TASKS: dict[str, TaskSpec] = {
    "mscoco": TaskSpec("mscoco", "MSCOCO_t2i", "T→I", True, False, False, True),
    "docvqa": TaskSpec("docvqa", "DocVQA", "I+T→T", True, True, True, False),
    "nights": TaskSpec("nights", "NIGHTS", "I→I", False, True, False, True),
}


def task_spec(name: str) -> TaskSpec:
    """Look a task up by CLI key ("mscoco") or subset name ("MSCOCO_t2i"), case-insensitively."""
    for spec in TASKS.values():
        if name.lower() in (spec.key, spec.subset.lower()):
            return spec
    raise ConfigError(f"task must be one of {', '.join(TASKS)} (or 'all'), got {name!r}")


def resolve_tasks(name: str) -> list[TaskSpec]:
    """'all' -> the three tasks in the table's order; otherwise the one named."""
    return list(TASKS.values()) if name.lower() == "all" else [task_spec(name)]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One unique candidate: the answer string (DocVQA) or the image file (MSCOCO, NIGHTS)."""

    text: str | None = None
    image: Path | None = None

    def to_item(self) -> Item:
        # No instruction: candidates are embedded with the model's default instruction.
        return Item(text=self.text, image=self.image)


@dataclass(frozen=True, slots=True)
class Query:
    """One query row; `candidates` index `TaskData.candidates`, the gold first (MMEB convention)."""

    instruction: str
    text: str | None
    image: Path | None
    candidates: tuple[int, ...]

    def to_item(self) -> Item:
        return Item(text=self.text, image=self.image, instruction=self.instruction)


@dataclass(frozen=True, slots=True)
class TaskData:
    """A loaded task: queries, unique candidates, and where they came from."""

    spec: TaskSpec
    queries: list[Query]
    candidates: list[Candidate]
    source: Path

    def query_items(self) -> list[Item]:
        return [query.to_item() for query in self.queries]

    def candidate_items(self) -> list[Item]:
        return [candidate.to_item() for candidate in self.candidates]


def clean_instruction(instruction: str | None) -> str:
    """Remove the `<|image_1|>` marker (the serializer places the image itself) and strip."""
    return (instruction or "").replace(IMAGE_MARKER, "").strip()


def find_task_file(data_dir: Path, subset: str) -> list[Path]:
    """The file(s) holding one subset under `data_dir` (see the module docstring for the layout)."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise InputError(f"{data_dir}: data directory not found; pass --data DIR with the MMEB files")
    for candidate in (
        data_dir / f"{subset}.parquet",
        data_dir / f"{subset}.jsonl",
        data_dir / subset / "test.parquet",
        data_dir / subset / "test.jsonl",
    ):
        if candidate.is_file():
            return [candidate]
    shards = sorted((data_dir / subset).glob("*.parquet")) if (data_dir / subset).is_dir() else []
    if shards:
        return shards
    raise InputError(
        f"{data_dir}: no file for task {subset}; expected {subset}.parquet, {subset}.jsonl, "
        f"{subset}/test.parquet or {subset}/*.parquet (MMEB_Test_Instruct format)"
    )


@dataclass(frozen=True, slots=True)
class Row:
    """One validated MMEB row and where it is, e.g. "DocVQA.jsonl (line 3)", for messages."""

    values: dict
    where: str


def read_rows(path: Path) -> list[Row]:
    """Rows of a parquet or jsonl file; every row is checked for the MMEB_Test_Instruct fields."""
    rows = _read_parquet(path) if path.suffix == ".parquet" else _read_jsonl(path)
    if not rows:
        raise InputError(f"{path}: the file has no rows")
    for row in rows:
        validate_row(row.values, row.where)
    return rows


def _read_parquet(path: Path) -> list[Row]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as error:  # pyarrow raises several types for broken files
        raise InputError(f"{path}: not a readable parquet file ({error}); re-download it") from None
    # One schema for the whole file: a missing column is reported once, not per row.
    missing = [column for column in COLUMNS if column not in table.column_names]
    if missing:
        raise InputError(
            f"{path}: missing column(s) {', '.join(missing)}; the MMEB_Test_Instruct format has "
            f"{', '.join(COLUMNS)} (found {', '.join(sorted(table.column_names))})"
        )
    # 0-based row numbers, as pyarrow and pandas index them.
    return [Row(values, f"{path} (row {index})") for index, values in enumerate(table.to_pylist())]


def _read_jsonl(path: Path) -> list[Row]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):  # 1-based lines, as editors number them
            if not line.strip():
                continue
            try:
                values = json.loads(line)
            except json.JSONDecodeError as error:
                raise InputError(f"{path} (line {number}): not valid JSON ({error}); fix or remove the line") from None
            rows.append(Row(values, f"{path} (line {number})"))
    return rows


def validate_row(values: object, where: str) -> None:
    """Raise InputError naming `where` and the field when a row lacks a field or has the wrong type.

    Strings may be null (read as empty); each list entry is a string or null.
    """
    if not isinstance(values, dict):
        raise InputError(f"{where}: expected one row (a JSON object), got {type(values).__name__}; {_FIX}")
    missing = [column for column in COLUMNS if column not in values]
    if missing:
        raise InputError(f"{where}: missing field(s) {', '.join(missing)}; {_FIX}")
    for column in STRING_COLUMNS:
        _check_string(values[column], column, where)
    for column in LIST_COLUMNS:
        entries = values[column]
        if not isinstance(entries, (list, tuple)):
            raise InputError(
                f"{where}: field {column} must be a list of candidates, got {type(entries).__name__} "
                f"{_excerpt(entries)}; {_FIX}"
            )
        for j, entry in enumerate(entries):
            _check_string(entry, f"{column}[{j}]", where)


def _check_string(value: object, field: str, where: str) -> None:
    if value is not None and not isinstance(value, str):
        raise InputError(
            f"{where}: field {field} must be a string, got {type(value).__name__} {_excerpt(value)}; {_FIX}"
        )


def _excerpt(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def load_task(
    task: str | TaskSpec,
    data_dir: str | Path,
    *,
    image_root: str | Path | None = None,
    limit: int | None = None,
) -> TaskData:
    """Load one task from a local directory.

    Args:
        task: "mscoco" | "docvqa" | "nights" (or the subset name) or a `TaskSpec`.
        data_dir: directory in the layout of the module docstring.
        image_root: directory the relative image paths start from (default: found under data_dir).
        limit: keep the first `limit` queries (and only the candidates they reference).

    Raises InputError for missing files, columns or images, or malformed rows.
    """
    spec = task if isinstance(task, TaskSpec) else task_spec(task)
    if limit is not None and limit < 1:
        raise ConfigError(f"limit must be >= 1 (queries per task), got {limit}")
    files = find_task_file(Path(data_dir), spec.subset)
    rows = [row for path in files for row in read_rows(path)]
    rows = rows[:limit] if limit is not None else rows
    root = find_image_root(Path(data_dir), rows, spec, image_root)
    queries, candidates = _parse_rows(rows, spec, root)
    _check_images(queries, candidates, files[0], root)
    log.info("%s: %d queries, %d unique candidates from %s", spec.subset, len(queries), len(candidates), files[0])
    return TaskData(spec, queries, candidates, files[0])


def _parse_rows(rows: list[Row], spec: TaskSpec, root: Path | None) -> tuple[list[Query], list[Candidate]]:
    # Unique candidates are embedded once: the key is what the candidate is made of (answer
    # string for DocVQA, image path for image tasks), as the official eval keys (text, img_path).
    index: dict[Candidate, int] = {}
    candidates: list[Candidate] = []
    queries: list[Query] = []
    for source in rows:
        row, where = source.values, source.where
        texts, images = row["tgt_text"], row["tgt_img_path"]
        n = len(images) if spec.candidate_image else len(texts)
        if spec.candidate_text and spec.candidate_image and len(texts) != len(images):
            raise InputError(
                f"{where}: tgt_text has {len(texts)} entries but tgt_img_path has {len(images)}; "
                "give one entry per candidate in both lists"
            )
        if n == 0:
            raise InputError(f"{where}: the row has no candidates; add them or remove the row")
        ids = []
        for j in range(n):
            candidate = Candidate(
                text=_required(clean_instruction(texts[j]), f"{where}: tgt_text[{j}]") if spec.candidate_text else None,
                image=_image_path(images[j], root, f"{where}: tgt_img_path[{j}]") if spec.candidate_image else None,
            )
            if candidate not in index:
                index[candidate] = len(candidates)
                candidates.append(candidate)
            ids.append(index[candidate])
        text = clean_instruction(row["qry_text"]) if spec.query_text else None
        queries.append(
            Query(
                instruction=clean_instruction(row["qry_inst"]),
                text=_required(text, f"{where}: qry_text") if spec.query_text else None,
                image=_image_path(row["qry_img_path"], root, f"{where}: qry_img_path") if spec.query_image else None,
                candidates=tuple(ids),
            )
        )
    return queries, candidates


def find_image_root(data_dir: Path, rows: list[Row], spec: TaskSpec, image_root: str | Path | None) -> Path | None:
    """The directory the relative image paths start from (None when the task has no images)."""
    if not (spec.query_image or spec.candidate_image):
        return None
    if image_root is not None:
        return Path(image_root)
    sample = _first_image_path(rows, spec)
    if not sample or Path(sample).is_absolute():
        return data_dir
    images = data_dir / "images"
    roots = [images, data_dir]
    if images.is_dir():  # the mmeb_v1 archive extracts into one top folder of its own
        roots += sorted(p for p in images.iterdir() if p.is_dir())
    for root in roots:
        if (root / sample).is_file():
            return root
    return images if images.is_dir() else data_dir


def _first_image_path(rows: list[Row], spec: TaskSpec) -> str | None:
    """The first non-empty image path the task uses, to probe where the image root is."""
    for row in rows:
        paths = [row.values["qry_img_path"]] if spec.query_image else list(row.values["tgt_img_path"])
        for path in paths:
            if path and path.strip():
                return path.strip()
    return None


def _check_images(queries: list[Query], candidates: list[Candidate], path: Path, root: Path | None) -> None:
    files = {q.image for q in queries if q.image is not None} | {c.image for c in candidates if c.image is not None}
    missing = sorted(str(f) for f in files if not f.is_file())
    if missing:
        raise InputError(
            f"{path}: {len(missing)} of {len(files)} image(s) not found under image root {root}, e.g. "
            f"{missing[0]}; pass --image-root DIR (the folder the relative image paths start from)"
        )


def _required(text: str | None, where: str) -> str:
    if not text:
        raise InputError(f"{where}: empty, but this task needs a text here; fill it in or remove the row")
    return text


def _image_path(value: object, root: Path | None, where: str) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: empty, but this task needs an image path here; fill it in or remove the row")
    path = Path(value.strip())
    return path if path.is_absolute() or root is None else root / path
