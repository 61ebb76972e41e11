"""Every declared collection setting through every front end that takes collection settings:
`Retriever.from_pretrained`, `Retriever.for_collection` and `Retriever.open` (keywords), `faste-mm
index` and `faste-mm serve` (flags). The lists come from the declarations (`CollectionProfile`'s
`setting(...)` fields), so a new setting must work everywhere before this passes: it needs an
example value below, and each front end must record it (index) or check it (open, serve)."""

from __future__ import annotations

import importlib.util
import re

import pytest
from typer.testing import CliRunner

from faste_mm.cli.app import app
from faste_mm.cli.setting_flags import FLAGS, flags_of, on_index, on_serve
from faste_mm.errors import CollectionError, ConfigError
from faste_mm.model.video import VideoConfig
from faste_mm.retrieval.profile import KEEPS, PRECISIONS, CollectionProfile, read_profile, setting_of
from faste_mm.retrieval.receipt import PlanReceipt
from faste_mm.retrieval.retriever import Retriever
from faste_mm.retrieval.setting import settings_of

from tests.helpers.inputs import noise_image

runner = CliRunner()

# A valid value other than the default for every setting a user gives (keyword or flag), chosen to
# work together on the tiny model (6 layers, width 64).
EXAMPLES = dict(dim=16, min_pixels=2048, max_pixels=65536, video=VideoConfig(fps=2.0, max_frames=8, max_pixels=200_704),
                r_max=0.25, warmup_layer=1, threshold=0.6, trigger_layer=2, vectors="float16", keep="none",
                reranker="org/some-reranker", min_score=0.1, patch_dedup="exact",
                receipt=PlanReceipt(0.25, 65536, "float32", None, 8, 10, 0.9, None, 0.99, 0.95, 1.5, 1.4, "cpu",
                                    "2026-11-26T00:00:00", "org/model"))
# A second valid value, for the refusals.
OTHERS = dict(dim=8, min_pixels=1024, max_pixels=131072, video=VideoConfig(fps=4.0, max_frames=8, max_pixels=200_704),
              r_max=0.5, warmup_layer=2, threshold=0.5, trigger_layer=3, vectors="float32", keep="float",
              reranker="org/other-reranker", patch_dedup="near")
# Given on the command line another way than by a flag of its own (index --plan writes the receipt).
NOT_BY_FLAG = {"receipt": "--plan"}
# OCR reads every image at index time with faste-mm[ocr]'s engine: walked where it is installed
# (tests/test_ocr.py covers --ocr and ocr= with it).
if importlib.util.find_spec("rapidocr_onnxruntime") is not None:
    EXAMPLES["ocr"] = True
SKIPPED = {} if "ocr" in EXAMPLES else {"ocr": "needs faste-mm[ocr]"}


def _user_settings() -> list[str]:
    return [name for name, s in settings_of(CollectionProfile).items() if (s.keyword or s.flags) and name not in SKIPPED]


def _flag_args(names, values=EXAMPLES) -> list[str]:
    """The command-line flags giving values[name] for each of `names` (each setting's first flag;
    a setting made of parts: every part's flag)."""
    args = []
    for name in names:
        declared, value = setting_of(name), values.get(name)
        if name in ("model_id", "model_revision") or name in NOT_BY_FLAG:
            continue
        parts = [flag for flag in declared.flags if flag.part is not None]
        if declared.flags[0].type is bool:  # a switch: --ocr / --no-ocr
            args.append(declared.flags[0].name if value else "--no-" + declared.flags[0].name[2:])
        elif parts:
            args += [arg for flag in parts for arg in (flag.name, str(getattr(value, flag.part)))]
        else:
            args += [declared.flags[0].name, str(value)]
    return args


def _assert_recorded(profile: CollectionProfile, names) -> None:
    for name in names:
        assert getattr(profile, name) == EXAMPLES[name], name


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    return noise_image(tmp_path_factory.mktemp("walk") / "a.png", (48, 40), 1)


def test_every_user_setting_has_an_example_a_keyword_and_a_flag_or_a_stated_route():
    for name in _user_settings():
        declared = setting_of(name)
        if name in ("model_id", "model_revision"):  # `model=` / `revision=` arguments, --model / --revision
            assert declared.flags and not declared.keyword
            continue
        assert name in EXAMPLES, f"new setting {name!r}: give it an example value in EXAMPLES"
        assert EXAMPLES[name] != getattr(CollectionProfile(), name), name
        assert name in Retriever.SETTINGS, name
        assert declared.flags or name in NOT_BY_FLAG, f"{name}: declare its CLI flag (Flag(...)) in profile.py"
        assert declared.help and all(flag.help for flag in declared.flags)
        if declared.refuse:
            assert name in OTHERS, f"{name}: give it a second value in OTHERS"
    assert (PRECISIONS, KEEPS) == _quantization_choices()


def _quantization_choices():
    from faste_mm.indexers.quantization import KEEPS, PRECISIONS

    return PRECISIONS, KEEPS


def test_the_commands_take_exactly_the_declared_flags():
    from faste_mm.cli.index_command import index_command
    from faste_mm.cli.serve import serve_command

    assert index_command.setting_flags == tuple(flag.name for flag in flags_of(on_index)) == tuple(FLAGS)
    assert set(SKIPPED) <= {"ocr"}  # only a setting whose walk needs an optional extra may sit out
    assert serve_command.setting_flags == tuple(flag.name for flag in flags_of(on_serve))
    assert "--dim" in serve_command.setting_flags and "--reranker" not in serve_command.setting_flags


def test_from_pretrained_and_for_collection_record_every_setting(model_dirs, image, tmp_path):
    model = str(model_dirs["qwen3_vl"])
    names = [name for name in Retriever.SETTINGS if name not in SKIPPED]
    with Retriever.from_pretrained(model, device="cpu", **{name: EXAMPLES[name] for name in names}) as retriever:
        retriever.index([image], collection=tmp_path / "a")
    _assert_recorded(read_profile(tmp_path / "a"), names)
    with Retriever.for_collection(tmp_path / "b", model, device="cpu", **{name: EXAMPLES[name] for name in names}) as retriever:
        retriever.index([image])
    _assert_recorded(read_profile(tmp_path / "b"), names)
    # open: every setting equal to the collection's is accepted; a different refusing one is refused
    assert Retriever.open(tmp_path / "b", **{name: EXAMPLES[name] for name in names}).r_max == EXAMPLES["r_max"]
    for name, other in OTHERS.items():
        if setting_of(name).refuse:
            with pytest.raises(CollectionError, match=re.escape(f"{name} ({setting_of(name).flag})")):
                Retriever.open(tmp_path / "b", **{name: other})
        else:  # informational: the collection's is kept
            Retriever.open(tmp_path / "b", **{name: other})
    with pytest.raises(ConfigError, match=r"unknown collection settings \['rmax'\]; valid ones are \["):
        Retriever.open(tmp_path / "b", rmax=0.5)
    with pytest.raises(ConfigError, match="unknown collection settings"):
        Retriever.from_pretrained(model, rmax=0.5)


def test_index_records_every_flag_and_serve_takes_and_checks_them(model_dirs, image, tmp_path, monkeypatch):
    model, col = str(model_dirs["qwen3_vl"]), str(tmp_path / "col")
    names = [name for name in _user_settings() if name not in NOT_BY_FLAG]
    result = runner.invoke(app, ["index", str(image), "-c", col, "--model", model, "--device", "cpu",
                                 "--format", "json", *_flag_args(names)])
    assert result.exit_code == 0, result.output
    _assert_recorded(read_profile(col), [name for name in names if name in EXAMPLES])
    assert read_profile(col).model_id == model
    # serve -c: the same values are accepted (the engine loads), a different one is refused by its flag
    pytest.importorskip("fastapi")
    import faste_mm.cli.serve as serve

    started = []
    monkeypatch.setattr(serve, "_run", lambda engine, *args: started.append(engine))
    import faste_mm.cli.collection_commands as commands  # the recorded "org/some-reranker" is no model

    monkeypatch.setattr(commands, "load_reranker", lambda *args: None)
    served = [name for name in names if setting_of(name).refuse]
    result = runner.invoke(app, ["serve", "-c", col, "--device", "cpu", *_flag_args(served)])
    assert result.exit_code == 0, (result.output, result.exception)
    assert started and started[0].retriever.profile().r_max == EXAMPLES["r_max"]
    for name in served:
        if name in OTHERS:
            refused = runner.invoke(app, ["serve", "-c", col, "--device", "cpu", *_flag_args([name], OTHERS)])
            assert refused.exit_code == 1 and setting_of(name).flag.rstrip("*") in refused.stderr, (name, refused.output)
    assert len(started) == 1  # no refused one got as far as serving


def test_an_embeddings_only_server_refuses_a_collection_only_setting_by_its_flag(model_dirs):
    pytest.importorskip("fastapi")
    result = runner.invoke(app, ["serve", "--model", str(model_dirs["qwen3_vl"]), "--device", "cpu", "--dim", "8",
                                 "--keep", "none"])
    assert result.exit_code == 1
    assert "--dim, --keep describe a collection's vectors; serve a collection with -c" in result.stderr


def test_two_flags_of_one_setting_are_refused_naming_both(tmp_path, image):
    result = runner.invoke(app, ["index", str(image), "-c", str(tmp_path / "c"), "--max-pixels", "65536",
                                 "--visual-tokens", "64"])
    assert result.exit_code == 1
    assert "give --max-pixels or --visual-tokens, not both" in result.stderr
    assert not (tmp_path / "c").exists()


def test_the_manuals_settings_table_is_the_generated_one():
    from pathlib import Path

    from faste_mm.cli.setting_flags import settings_table

    manual = (Path(__file__).parents[1] / "docs" / "collections.md").read_text(encoding="utf-8")
    assert settings_table() in manual, (
        "docs/collections.md: paste the table printed by python -m faste_mm.cli.setting_flags")
    for name in _user_settings():
        assert f"`{name}`" in settings_table(), name
