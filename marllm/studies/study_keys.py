"""The keys of a study file (see :mod:`marllm.studies.spec`), each read strictly: ``base``, ``overrides`` and each
variant's, ``grid``, ``seeds``, ``compare`` and ``resources``. A value of the wrong shape is a ConfigError naming the
key."""

from __future__ import annotations

import copy
import difflib
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from marllm.config.loading import ConfigError, read_yaml
from marllm.config.paths import absolute_config_paths

STUDY_OWNED = ("seed", "run_dir")  # config keys a study sets for each of its runs
RESOURCE_KEYS = ("cpus", "gpus")


def read_base(base: Any, root: Path) -> dict[str, Any]:
    """``base``: a config file path (read relative to ``root``, the study file's folder) or an inline mapping."""
    if isinstance(base, str):  # its paths are relative to it, as for marllm train
        return absolute_config_paths(read_yaml(root / base), (root / base).resolve().parent)
    if isinstance(base, Mapping) and base:
        return copy.deepcopy(dict(base))
    raise ConfigError(f"study base must be a config file path (relative to the study file) or a mapping, got {base!r}")


def read_overrides(value: Any, key: str) -> list[str]:
    """``overrides`` or a variant's (``key`` names which): dotted overrides, as a list or a mapping."""
    if isinstance(value, Mapping):  # {dotted.key: value, ...}
        overrides = [f"{name}={inline(item)}" for name, item in value.items()]
    elif isinstance(value, list) and all(isinstance(item, str) and "=" in item for item in value):
        overrides = list(value)
    else:
        raise ConfigError(
            f"study {key} must be a list of dotted overrides like iterations=50, or a mapping like "
            f"{{iterations: 50}}, got {value!r}"
        )
    for override in overrides:
        _refuse_study_owned(override.split("=", 1)[0].strip(), key)
    return overrides


def _refuse_study_owned(name: str, where: str) -> None:
    """``seed`` and ``run_dir`` belong to the study: a variant, override or grid setting them would be overridden."""
    if name in STUDY_OWNED:
        raise ConfigError(
            f"study {where} sets {name!r}, which the study decides: seeds come from the study's `seeds` list and "
            "each run's directory from the study directory; remove it"
        )


def read_grid(grid: Any) -> dict[str, list[Any]]:
    """``grid``: each dotted key's non-empty list of values."""
    if grid is None:
        return {}
    if not isinstance(grid, Mapping):
        raise ConfigError(f"study grid must be a mapping of dotted key: [values], got {grid!r}")
    for key, values in grid.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"study grid keys must be dotted config keys, got {key!r}")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"study grid.{key} must be a non-empty list of values, got {values!r}")
        _refuse_study_owned(key, "grid")
    return {key: list(values) for key, values in grid.items()}


def is_empty(value: Any) -> bool:
    """Whether a study key is given empty: ``null``, ``{}`` or ``[]``."""
    return value is None or (isinstance(value, Mapping | list) and not value)


def no_runs(key: str, value: Any, fix: str) -> ConfigError:
    """The error for an empty ``variants`` or ``seeds``: the study would have no runs."""
    shown = "null" if value is None else json.dumps(value)
    return ConfigError(
        f"study {key} is empty ({shown}): a study runs each variant once per seed, so it would have no runs; {fix}"
    )


def read_seeds(seeds: Any) -> list[int]:
    """``seeds``: distinct integers >= 0, at least one."""
    if is_empty(seeds):
        raise no_runs("seeds", seeds, "give one seed or more, e.g. seeds: [0] (the default when seeds is left out)")
    valid = isinstance(seeds, list) and seeds and all(type(s) is int and s >= 0 for s in seeds)
    if not valid or len(set(seeds)) != len(seeds):
        raise ConfigError(f"study seeds must be a non-empty list of distinct integers >= 0, got {seeds!r}")
    return list(seeds)


def read_compare(pairs: Any, variants: list[str]) -> list[list[str]]:
    """``compare``: pairs of the study's ``variants``."""
    if pairs is None:
        return []
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise ConfigError(f"study compare must be a list of [variant, variant] pairs, got {pairs!r}")
    for pair in pairs:
        for variant in pair:
            if variant not in variants:
                raise ConfigError(f"study compare names variant {variant!r}, which is not one of {variants}")
    return [list(pair) for pair in pairs]


def read_resources(resources: Any) -> dict[str, float]:
    """``resources``: what each run asks for, ``cpus`` and ``gpus``."""
    if resources is None:
        return {}
    if not isinstance(resources, Mapping):
        raise ConfigError(f"study resources must be a mapping like {{cpus: 1, gpus: 0}}, got {resources!r}")
    for key, value in resources.items():
        if key not in RESOURCE_KEYS:
            raise ConfigError(
                f"unknown study key 'resources.{key}'{hint(str(key), RESOURCE_KEYS)}; valid: {list(RESOURCE_KEYS)}"
            )
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"study resources.{key} must be a number, got {value!r}")
        if key == "cpus" and value <= 0:
            raise ConfigError(f"study resources.cpus must be > 0 (a run needs a CPU; 0.5 shares one), got {value!r}")
        if key == "gpus" and (value < 0 or (value > 1 and value != int(value))):
            raise ConfigError(
                f"study resources.gpus must be 0, a fraction of one GPU (0.5) or a whole number, got {value!r}"
            )
    return dict(resources)


def hint(key: str, valid: Sequence[str]) -> str:
    """`` (did you mean '...'?)`` naming the ``valid`` key closest to ``key``, or nothing."""
    close = difflib.get_close_matches(key, valid, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def inline(value: Any) -> str:
    """A grid value as override text (JSON is YAML: ``-0.5``, ``null``, ``[1, 2]``, ``"text"``)."""
    return json.dumps(value, separators=(",", ":"))
