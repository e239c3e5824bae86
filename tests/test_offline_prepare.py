"""prepare / load_assets / ensure_assets on a tiny corpus and recipe: layout, no-op, corruption, versioning."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from marllm.assets.offline import (
    AssetsNotPreparedError,
    CorruptAssetError,
    SentimentClassifier,
    ensure_assets,
    load_assets,
    prepare,
)
from marllm.assets.offline import preparation as prepare_module
from marllm.assets.offline.recipe import RECIPE_VERSION
from marllm.utils.files import sha256_file
from tests.offline_support import REVIEWS_CSV, tiny_recipe, write_polarity_csv, write_tiny_corpus


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """One tiny prepare shared by the tests; destructive tests work on a copy of its home."""
    base = tmp_path_factory.mktemp("offline")
    source = write_tiny_corpus(base / "corpus")
    assets = prepare(base / "home", progress=False, recipe=tiny_recipe(), corpus_source=source)
    return assets, source


@pytest.fixture
def home_copy(prepared, tmp_path):
    assets, source = prepared
    shutil.copytree(assets.home, tmp_path / "home")
    return tmp_path / "home", source


def forbid_building(monkeypatch, *phases):
    """Make the named phases fail if they run, so a test proves they were reused."""
    for phase in phases:
        def refuse(*args, _phase=phase, **kwargs):
            raise AssertionError(f"phase {_phase} was rebuilt")

        monkeypatch.setattr(prepare_module, f"_build_{phase}", refuse)


def test_prepare_writes_every_asset_and_a_complete_manifest(prepared):
    assets, _ = prepared
    assert assets.root.parent == assets.home and assets.root.name == tiny_recipe().directory_name
    train = assets.train_rows()
    heldout = assets.heldout_rows()
    assert len(train) + len(heldout) == 12 + 24
    assert {row["label"] for row in train} == {0, 1} and {row["source"] for row in heldout} == {"review", "snippet"}
    assert set(train[0]) == {"text", "label", "source"}
    split = json.loads(assets.split_file.read_text())
    assert split["seed"] == 0 and len(split["indices"]["review"]["heldout"]) == 4  # 25% of 6 per label, rounded

    manifest = assets.manifest
    assert manifest["recipe_key"] == tiny_recipe().key and manifest["recipe_version"] == RECIPE_VERSION
    assert manifest["recipe"]["base_model"]["n_layer"] == 1
    for relative, digest in manifest["files"].items():
        assert sha256_file(assets.root / relative) == digest
    assert {"base_model/model.safetensors", "reward_model/weights.safetensors", "corpus/train.jsonl"} <= set(
        manifest["files"]
    )
    assert set(manifest["wall_s"]) == {"corpus", "base_model", "reward_model", "this_prepare"}
    assert manifest["metrics"]["heldout_perplexity"] > 1
    assert 0 <= manifest["metrics"]["heldout_review_accuracy"] <= 1
    assert manifest["phases"]["base_model"]["metrics"]["arithmetic_documents"] > 0


def test_base_model_loads_like_a_hub_model_and_the_reward_model_scores(prepared):
    assets, _ = prepared
    model = AutoModelForCausalLM.from_pretrained(assets.base_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(assets.base_model_dir)
    assert type(model).__name__ == "GPT2LMHeadModel" and model.config.n_layer == 1
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    batch = tokenizer(["the film is"], return_tensors="pt")
    assert model.generate(**batch, max_new_tokens=2, do_sample=False).shape[1] == batch["input_ids"].shape[1] + 2

    classifier = assets.load_reward_model()
    logits = classifier.positive_logits(["wonderful superb film", "terrible boring film"])
    assert logits[0] > logits[1]
    again = SentimentClassifier.load(assets.reward_model_dir).positive_logits(["wonderful superb film"])
    np.testing.assert_array_equal(again, logits[:1])


def test_second_prepare_is_a_no_op(home_copy, monkeypatch):
    home, source = home_copy
    before = {p: p.stat().st_mtime_ns for p in home.rglob("*") if p.is_file()}
    forbid_building(monkeypatch, "corpus", "base_model", "reward_model")
    assets = prepare(home, progress=False, recipe=tiny_recipe(), corpus_source=source)
    assert assets.manifest["files"]
    assert {p: p.stat().st_mtime_ns for p in home.rglob("*") if p.is_file()} == before
    assert ensure_assets(home, recipe=tiny_recipe(), progress=False).root == assets.root


def test_load_without_prepare_says_how_to_prepare(tmp_path):
    with pytest.raises(AssetsNotPreparedError, match="marllm prepare") as error:
        load_assets(tmp_path / "empty", recipe=tiny_recipe())
    assert isinstance(error.value, FileNotFoundError) and "manifest.json" in str(error.value)


def test_load_assets_names_a_corrupted_file(home_copy):
    home, _ = home_copy
    root = home / tiny_recipe().directory_name
    weights = root / "reward_model" / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CorruptAssetError, match="weights.safetensors: sha256") as error:
        load_assets(home, recipe=tiny_recipe())
    assert "marllm prepare" in str(error.value) and isinstance(error.value, ValueError)


def test_ensure_rebuilds_only_the_damaged_phase(home_copy, monkeypatch):
    home, source = home_copy
    root = home / tiny_recipe().directory_name
    reference = load_assets(home, recipe=tiny_recipe())
    weights = root / "reward_model" / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:50])  # truncated
    forbid_building(monkeypatch, "corpus", "base_model")
    assets = ensure_assets(home, recipe=tiny_recipe(), corpus_source=source, progress=False)
    assert sha256_file(weights) == reference.manifest["files"]["reward_model/weights.safetensors"]  # deterministic
    assert assets.manifest["phases"]["reward_model"]["reused"] is False
    assert assets.manifest["phases"]["base_model"]["reused"] is True
    load_assets(home, recipe=tiny_recipe())


def test_ensure_rebuilds_a_truncated_base_model(home_copy, monkeypatch):
    home, source = home_copy
    root = home / tiny_recipe().directory_name
    model_file = root / "base_model" / "model.safetensors"
    model_file.write_bytes(model_file.read_bytes()[:100])
    forbid_building(monkeypatch, "corpus", "reward_model")
    assets = ensure_assets(home, recipe=tiny_recipe(), corpus_source=source, progress=False)
    assert AutoModelForCausalLM.from_pretrained(assets.base_model_dir).config.n_layer == 1
    assert assets.manifest["phases"]["base_model"]["reused"] is False


def test_a_garbled_manifest_is_reported_then_rebuilt_without_retraining(home_copy, monkeypatch):
    home, source = home_copy
    manifest = home / tiny_recipe().directory_name / "manifest.json"
    manifest.write_text(manifest.read_text()[:30])
    with pytest.raises(CorruptAssetError, match="not valid JSON"):
        load_assets(home, recipe=tiny_recipe())
    forbid_building(monkeypatch, "corpus", "base_model", "reward_model")
    assert prepare(home, progress=False, recipe=tiny_recipe(), corpus_source=source).manifest["files"]


def test_an_interrupted_prepare_leaves_no_manifest_and_resumes(home_copy, monkeypatch):
    home, source = home_copy
    root = home / tiny_recipe().directory_name
    monkeypatch.setattr(prepare_module, "_build_reward_model", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        prepare(home, force=True, progress=False, recipe=tiny_recipe(), corpus_source=source)
    assert not (root / "manifest.json").exists()
    assert not list(root.glob(".*.tmp-*"))  # the half-built phase directory was removed
    with pytest.raises(AssetsNotPreparedError):
        load_assets(home, recipe=tiny_recipe())
    monkeypatch.undo()
    forbid_building(monkeypatch, "corpus", "base_model")  # rebuilt by the forced run before the interruption
    assert ensure_assets(home, recipe=tiny_recipe(), corpus_source=source, progress=False).manifest


def test_a_changed_recipe_prepares_into_its_own_directory(prepared, tmp_path):
    assets, source = prepared
    other = tiny_recipe(max_steps=2)
    assert other.key != tiny_recipe().key
    with pytest.raises(AssetsNotPreparedError):
        load_assets(assets.home, recipe=other)
    rebuilt = prepare(tmp_path / "home", progress=False, recipe=other, corpus_source=source)
    assert rebuilt.root.name == other.directory_name
    assert rebuilt.manifest["recipe"]["base_model"]["max_steps"] == 2


def test_prepare_reports_a_bad_csv(tmp_path):
    source = write_tiny_corpus(tmp_path / "corpus")
    write_polarity_csv(source / REVIEWS_CSV, [("1", "fine"), ("0", "a zero label")])
    with pytest.raises(ValueError, match=r"polarity-en-pang&lee1.csv: record 2 has label '0'"):
        prepare(tmp_path / "home", progress=False, recipe=tiny_recipe(), corpus_source=source)
    write_polarity_csv(source / REVIEWS_CSV, [])
    with pytest.raises(ValueError, match="holds no rows"):
        prepare(tmp_path / "home", progress=False, recipe=tiny_recipe(), corpus_source=source)
    assert not list((tmp_path / "home").rglob("manifest.json"))


def test_home_defaults_to_the_environment_variable(prepared, monkeypatch):
    assets, _ = prepared
    monkeypatch.setenv("MARLLM_HOME", str(assets.home))
    assert load_assets(recipe=tiny_recipe()).root == assets.root


def test_home_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        load_assets(tmp_path / "file", recipe=tiny_recipe())


def test_recipe_from_dict_validates_names():
    from marllm.assets.offline import OfflineRecipe

    recipe = OfflineRecipe.from_dict({"base_model": {"max_steps": 7}})
    assert recipe.base_model.max_steps == 7 and recipe.key != OfflineRecipe().key
    assert OfflineRecipe.from_dict({}).key == OfflineRecipe().key
    with pytest.raises(ValueError, match="unknown base_model recipe parameter"):
        OfflineRecipe.from_dict({"base_model": {"layers": 2}})
    with pytest.raises(ValueError, match="unknown offline recipe section"):
        OfflineRecipe.from_dict({"tokenizer": {}})


def test_the_recipe_of_marllm_assets_is_the_one_the_environment_names(monkeypatch, tmp_path):
    from marllm.assets.offline import RECIPE_ENV, RECIPES, OfflineRecipe, default_recipe

    monkeypatch.delenv(RECIPE_ENV, raising=False)
    assert default_recipe() == OfflineRecipe() == RECIPES["full"]
    monkeypatch.setenv(RECIPE_ENV, " small ")
    assert default_recipe() is RECIPES["small"] and RECIPES["small"].key != RECIPES["full"].key
    with pytest.raises(prepare_module.AssetsNotPreparedError) as missing:  # looked for in the small recipe's directory
        load_assets(tmp_path / "home")
    assert RECIPES["small"].directory_name in str(missing.value)
    monkeypatch.setenv(RECIPE_ENV, "tiny")
    with pytest.raises(ValueError) as unknown:
        default_recipe()
    assert str(unknown.value) == "$MARLLM_OFFLINE_RECIPE='tiny' names no offline recipe; known: ['full', 'small']"


def test_a_preparation_compares_its_trained_files_with_the_published_bytes(prepared, home_copy, monkeypatch, capsys):
    """Where the recipe has published hashes, the manifest says whether this machine reproduced them, and a file that
    differs is named with both hashes; a recipe without published hashes records None."""
    assets, _ = prepared
    home, source = home_copy
    recipe = tiny_recipe()
    assert assets.manifest["reproduces_published"] is None  # nothing published for the tiny recipe
    base = "base_model/model.safetensors"
    monkeypatch.setitem(prepare_module.PUBLISHED_SHA256, recipe.key, {base: assets.manifest["files"][base]})
    rebuilt = prepare(home, force=True, progress=False, recipe=recipe, corpus_source=source)
    assert rebuilt.manifest["reproduces_published"] is True  # the same bytes from a second preparation
    monkeypatch.setitem(prepare_module.PUBLISHED_SHA256, recipe.key, {base: "0" * 64})
    capsys.readouterr()
    rebuilt = prepare(home, force=True, progress=False, recipe=recipe, corpus_source=source)
    assert rebuilt.manifest["reproduces_published"] is False
    message = f"{base} has sha256 {assets.manifest['files'][base]}, not the published {'0' * 64}"
    assert message in capsys.readouterr().err
