"""Study files: configs × variants × grid × seeds, read strictly and expanded into ordinary runs.

A study file is YAML::

    name: cory_vs_ppo
    base: ../cory_offline.yaml        # a config path relative to the study file, or an inline mapping
    overrides: [iterations=50]        # optional, applied to every run
    variants:                         # optional: named dotted overrides (default: one variant, "base")
      ppo: ["env.roles=[pioneer]", "env.templates=null", "agents.learners=[llm1]"]
      ppo_too: {env.roles: [pioneer], env.templates: null, agents.learners: [llm1]}   # the same, as a mapping
      cory: []
    grid:                             # optional: every combination of these values
      agents.reward_coefficients: [-1, 0, 1]
    seeds: [0, 1, 2]                  # optional (default [0])
    compare: [[cory, ppo]]            # optional: variant pairs the report compares
    resources: {cpus: 1, gpus: 0}     # optional, per run: what the Ray engine reserves for each (default 1 CPU)

Each run applies, in order: ``overrides``, its variant's overrides, its grid values, ``seed=S`` and
``logging.progress=false`` (the study shows one progress display). A variant whose own overrides set a grid key
is not crossed with that axis (its value stands). An override list is YAML: quote an override
that holds brackets, or give the overrides as a mapping of dotted keys (``overrides`` too).
"""

from __future__ import annotations

import copy
import difflib
import itertools
import json
import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marllm.config import TrainConfig, config_from_dict
from marllm.config.loading import ConfigError, apply_overrides, directory_given, read_yaml
from marllm.config.paths import absolute_config_paths
from marllm.studies.files import EXPANSION_FILE

STUDY_OWNED = ("seed", "run_dir")  # config keys a study sets for each of its runs
STUDY_KEYS = ("name", "base", "overrides", "variants", "grid", "seeds", "compare", "resources")
RESOURCE_KEYS = ("cpus", "gpus")
DEFAULT_RESOURCES = {"cpus": 1.0, "gpus": 0.0}
RUNS_DIR = "runs"
DEFAULT_VARIANT = "base"
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


@dataclass(frozen=True)
class StudyRun:
    """One run of a study.

    Attributes:
        name: filesystem-safe, unique in the study; its run directory is ``STUDY_DIR/runs/<name>``.
        variant: the variant's name.
        axes: the grid value of each grid key for this run.
        seed: the run's seed.
        overrides: every dotted override applied to the base config, in order.
        config: the built config.
    """

    name: str
    variant: str
    axes: dict[str, Any]
    seed: int
    overrides: list[str]
    config: TrainConfig

    @property
    def relative_dir(self) -> str:
        """The run directory relative to the study directory."""
        return f"{RUNS_DIR}/{self.name}"

    def to_dict(self) -> dict[str, Any]:
        """The run as recorded in ``study.json`` (without the config: each run directory holds it)."""
        return {
            "name": self.name,
            "variant": self.variant,
            "axes": dict(self.axes),
            "seed": self.seed,
            "overrides": list(self.overrides),
            "run_dir": self.relative_dir,
        }


@dataclass
class Study:
    """A parsed study file (see the module docstring); :meth:`runs` expands and validates it."""

    name: str
    base: dict[str, Any]
    overrides: list[str] = field(default_factory=list)
    variants: dict[str, list[str]] = field(default_factory=lambda: {DEFAULT_VARIANT: []})
    grid: dict[str, list[Any]] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=lambda: [0])
    compare: list[list[str]] = field(default_factory=list)
    resources: dict[str, float] = field(default_factory=dict)

    @property
    def run_resources(self) -> dict[str, float]:
        """What each run asks for: ``cpus`` and ``gpus``, the study file's ``resources`` over the defaults (1 CPU,
        no GPU). The local executor gives every run one thread whatever they say; the Ray engine reserves them."""
        return {**DEFAULT_RESOURCES, **{key: float(value) for key, value in self.resources.items()}}

    def runs(self) -> list[StudyRun]:
        """Every run (variants × grid × seeds, in that nesting), each config built and checked. A variant that sets
        a grid key itself (``ppo: [agents.reward_coefficients=null]``) is not crossed with that axis.

        Raises:
            ConfigError: an override of some run is invalid (the message names the study, the variant, the grid
                values and the seed, then the key), or there is no run (no variant, no seed or an empty grid axis).
        """
        runs: list[StudyRun] = []
        names: set[str] = set()
        for variant, variant_overrides in self.variants.items():
            keys = self.variant_axes(variant)
            for combo in itertools.product(*(self.grid[key] for key in keys)):
                axes = dict(zip(keys, combo, strict=True))
                for seed in self.seeds:
                    overrides = [
                        *self.overrides,
                        *variant_overrides,
                        *(f"{key}={_inline(value)}" for key, value in axes.items()),
                        f"seed={seed}",
                        "logging.progress=false",
                    ]
                    config = self._build(variant, axes, seed, overrides)
                    name = _unique(run_name(variant, axes, seed), names)
                    runs.append(StudyRun(name, variant, axes, seed, overrides, config))
        if not runs:
            raise ConfigError(
                f"study {self.name} has no runs: variants {list(self.variants)} × grid {self.grid} × seeds "
                f"{self.seeds}; give at least one variant, one value per grid key and one seed"
            )
        return runs

    def variant_axes(self, variant: str) -> list[str]:
        """The grid keys ``variant`` is crossed with: those its own overrides do not set."""
        own = {override.partition("=")[0] for override in self.variants[variant]}
        return [key for key in self.grid if key not in own]

    def check_references(self, runs: Sequence[StudyRun]) -> None:
        """Check that the model, reward model, dataset and device of every run exist on this machine (each distinct
        set once), so that a missing one stops the study before its first run rather than failing every run.

        Raises:
            ConfigError: naming the study, the variant, the grid values and the seed of the first run concerned,
                then the key.
        """
        checked: set[str] = set()
        for run in runs:
            references = repr((run.config.model, run.config.task))
            if references in checked:
                continue
            checked.add(references)
            try:
                run.config.check_references()
            except ConfigError as error:
                raise ConfigError(f"{self._where(run.variant, run.axes, run.seed)}: {error}") from error

    def _where(self, variant: str, axes: Mapping[str, Any], seed: int) -> str:
        where = [f"study {self.name}", f"variant {variant!r}"]
        where += [f"{key}={_inline(value)}" for key, value in axes.items()]
        where.append(f"seed {seed}")
        return ", ".join(where)

    def _build(self, variant: str, axes: Mapping[str, Any], seed: int, overrides: Sequence[str]) -> TrainConfig:
        try:
            return config_from_dict(apply_overrides(copy.deepcopy(self.base), overrides))
        except ConfigError as error:
            raise ConfigError(f"{self._where(variant, axes, seed)}: {error}") from error

    def to_file_dict(self) -> dict[str, Any]:
        """The study as a study file with its base config inline (what ``STUDY_DIR/study.yaml`` holds)."""
        data: dict[str, Any] = {"name": self.name, "base": self.base, "overrides": self.overrides}
        data.update(variants=self.variants, grid=self.grid, seeds=self.seeds, compare=self.compare)
        data["resources"] = self.resources
        return data

    def expansion(self, runs: Sequence[StudyRun] | None = None) -> dict[str, Any]:
        """What ``STUDY_DIR/study.json`` holds: the name, the expanded runs and the compared pairs."""
        runs = self.runs() if runs is None else runs
        return {"name": self.name, "runs": [run.to_dict() for run in runs], "compare": self.compare}


def expansion_changed(study_dir: Path, name: str, before: Any, after: Mapping[str, Any]) -> str:
    """Why the study ``name`` cannot run in ``study_dir``, whose ``study.json`` (``before``) lists other runs than
    its expansion ``after`` (:meth:`Study.expansion`): the runs added and removed, and the first changed run with
    the keys that changed, e.g. ``run ppo__seed0 changed iterations: 50 -> 60``. One line, ending with what to do."""
    old_runs = before.get("runs") if isinstance(before, Mapping) else None
    if not isinstance(old_runs, list) or not all(isinstance(_get(run, "name"), str) for run in old_runs):
        what = f"its {EXPANSION_FILE} does not list runs as marllm study writes them"
    else:
        old = {run["name"]: run for run in old_runs}
        new = {run["name"]: run for run in after["runs"]}
        changed = {key: _run_changes(old[key], new[key]) for key in old.keys() & new.keys() if old[key] != new[key]}
        parts = [f"new runs: {_names(new.keys() - old.keys())}"] if new.keys() - old.keys() else []
        parts += [f"runs no longer in it: {_names(old.keys() - new.keys())}"] if old.keys() - new.keys() else []
        first = next((key for key in new if key in changed), None)
        if first is not None:
            parts.append(f"run {first} changed {', '.join(changed[first])}")
            more = len(changed) - 1
            parts += [f"{more} more run{'s' if more > 1 else ''} changed"] if more else []
        what = "; ".join(parts) or "the order of its runs changed"
    return (
        f"{study_dir} holds a study whose runs differ from study {name}'s ({what}); give another --out, or start "
        "every run again with --overwrite"
    )


def _get(entry: Any, key: str) -> Any:
    return entry.get(key) if isinstance(entry, Mapping) else None


def _run_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``"key: old -> new"`` for each dotted override (then each other entry) that differs between two runs."""
    before, after = (_by_key(run.get("overrides")) for run in (old, new))
    changes = []
    for key in [*before, *(key for key in after if key not in before)]:
        if before.get(key) != after.get(key):
            changes.append(f"{key}: {before.get(key, '(absent)')} -> {after.get(key, '(absent)')}")
    for key in sorted((old.keys() | new.keys()) - {"overrides", "name"}):
        if old.get(key) != new.get(key):
            changes.append(f"{key}: {_inline(old.get(key))} -> {_inline(new.get(key))}")
    return changes or ["the order of its overrides"]


def _by_key(overrides: Any) -> dict[str, str]:
    """Dotted overrides ``key=value`` as ``{key: value}`` (the last of a key wins, as when they are applied)."""
    pairs = (str(override).partition("=") for override in overrides or [])
    return {key.strip(): value for key, _, value in pairs}


def _names(names: Collection[str]) -> str:
    listed = sorted(names)
    return ", ".join(listed[:3]) + (f" and {len(listed) - 3} more" if len(listed) > 3 else "")


def run_name(variant: str, axes: Mapping[str, Any], seed: int) -> str:
    """E.g. ``cory__agents.reward_coefficients=-0.5__seed1``, with characters unsafe in file names replaced."""
    parts = [variant, *(f"{key}={_inline(value)}" for key, value in axes.items()), f"seed{seed}"]
    return "__".join(_UNSAFE.sub("_", part).strip("._") or "_" for part in parts)


def _unique(name: str, taken: set[str]) -> str:
    candidate, count = name, 1
    while candidate in taken:
        count += 1
        candidate = f"{name}_{count}"
    taken.add(candidate)
    return candidate


def _inline(value: Any) -> str:
    """A grid value as override text (JSON is YAML: ``-0.5``, ``null``, ``[1, 2]``, ``"text"``)."""
    return json.dumps(value, separators=(",", ":"))


def load_study(path: str | Path) -> Study:
    """Read a study file; ``base`` as a path is read relative to the study file.

    Raises:
        ConfigError: the file is missing, not strict YAML, or holds an unknown key or a value of the wrong shape.
    """
    path = Path(path)
    if path.is_dir():
        raise directory_given(path, "study file", "examples/studies/cory_vs_ppo.yaml")
    if not path.is_file():
        raise ConfigError(f"study file {str(path)!r} does not exist")
    try:
        data = read_yaml(path)
    except ConfigError as error:
        if "not valid YAML" in str(error):
            error.add_note(
                'in a study file, quote an override that holds brackets ("env.roles=[pioneer]"), or give the '
                "overrides as a mapping ({env.roles: [pioneer]})"
            )
        raise
    return study_from_dict(data, path.parent)


def study_from_dict(data: Mapping[str, Any], root: Path = Path(".")) -> Study:
    """Build a :class:`Study` from study-file data (``root``: where a relative ``base`` path is read from)."""
    unknown = [key for key in data if key not in STUDY_KEYS]
    if unknown:
        raise ConfigError(f"unknown study key {unknown[0]!r}{_hint(unknown[0], STUDY_KEYS)}; valid: {list(STUDY_KEYS)}")
    name = data.get("name")
    if not isinstance(name, str) or not name or _UNSAFE.search(name):
        raise ConfigError(f"study name must be a non-empty string of letters, digits and ._=+-, got {name!r}")
    study = Study(name=name, base=_base(data.get("base"), root))
    study.overrides = _overrides(data.get("overrides", []), "overrides")
    variants = data.get("variants", {DEFAULT_VARIANT: []})
    if _empty(variants):
        fix = "give one variant or more (name: [overrides]), or leave variants out for one run of the base config"
        raise _no_runs("variants", variants, f"{fix} per seed")
    if not isinstance(variants, Mapping):
        raise ConfigError(f"study variants must be a non-empty mapping of name: [overrides], got {variants!r}")
    study.variants = {}
    for variant, overrides in variants.items():
        if not isinstance(variant, str) or not variant:
            raise ConfigError(f"study variant names must be non-empty strings, got {variant!r}")
        study.variants[variant] = _overrides(overrides if overrides is not None else [], f"variants.{variant}")
    study.grid = _grid(data.get("grid", {}))
    study.seeds = _seeds(data.get("seeds", [0]))
    study.compare = _compare(data.get("compare", []), list(study.variants))
    study.resources = _resources(data.get("resources", {}))
    return study


def _base(base: Any, root: Path) -> dict[str, Any]:
    if isinstance(base, str):  # its paths are relative to it, as for marllm train
        return absolute_config_paths(read_yaml(root / base), (root / base).resolve().parent)
    if isinstance(base, Mapping) and base:
        return copy.deepcopy(dict(base))
    raise ConfigError(f"study base must be a config file path (relative to the study file) or a mapping, got {base!r}")


def _overrides(value: Any, key: str) -> list[str]:
    if isinstance(value, Mapping):  # {dotted.key: value, ...}
        overrides = [f"{name}={_inline(item)}" for name, item in value.items()]
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


def _grid(grid: Any) -> dict[str, list[Any]]:
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


def _empty(value: Any) -> bool:
    """Whether a study key is given empty: ``null``, ``{}`` or ``[]``."""
    return value is None or (isinstance(value, Mapping | list) and not value)


def _no_runs(key: str, value: Any, fix: str) -> ConfigError:
    """The error for an empty ``variants`` or ``seeds``: the study would have no runs."""
    shown = "null" if value is None else json.dumps(value)
    return ConfigError(
        f"study {key} is empty ({shown}): a study runs each variant once per seed, so it would have no runs; {fix}"
    )


def _seeds(seeds: Any) -> list[int]:
    if _empty(seeds):
        raise _no_runs("seeds", seeds, "give one seed or more, e.g. seeds: [0] (the default when seeds is left out)")
    valid = isinstance(seeds, list) and seeds and all(type(s) is int and s >= 0 for s in seeds)
    if not valid or len(set(seeds)) != len(seeds):
        raise ConfigError(f"study seeds must be a non-empty list of distinct integers >= 0, got {seeds!r}")
    return list(seeds)


def _compare(pairs: Any, variants: list[str]) -> list[list[str]]:
    if pairs is None:
        return []
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise ConfigError(f"study compare must be a list of [variant, variant] pairs, got {pairs!r}")
    for pair in pairs:
        for variant in pair:
            if variant not in variants:
                raise ConfigError(f"study compare names variant {variant!r}, which is not one of {variants}")
    return [list(pair) for pair in pairs]


def _resources(resources: Any) -> dict[str, float]:
    if resources is None:
        return {}
    if not isinstance(resources, Mapping):
        raise ConfigError(f"study resources must be a mapping like {{cpus: 1, gpus: 0}}, got {resources!r}")
    for key, value in resources.items():
        if key not in RESOURCE_KEYS:
            raise ConfigError(
                f"unknown study key 'resources.{key}'{_hint(str(key), RESOURCE_KEYS)}; valid: {list(RESOURCE_KEYS)}"
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


def _hint(key: str, valid: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
