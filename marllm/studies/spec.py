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
import itertools
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marllm.config import TrainConfig, config_from_dict
from marllm.config.loading import ConfigError, apply_overrides, directory_given, read_yaml
from marllm.studies.files import EXPANSION_FILE
from marllm.studies.study_keys import hint as _hint
from marllm.studies.study_keys import inline as _inline
from marllm.studies.study_keys import (
    is_empty,
    no_runs,
    read_base,
    read_compare,
    read_grid,
    read_overrides,
    read_resources,
    read_seeds,
)

STUDY_KEYS = ("name", "base", "overrides", "variants", "grid", "seeds", "compare", "resources")
DEFAULT_RESOURCES = {"cpus": 1.0, "gpus": 0.0}
RUNS_DIR = "runs"
DEFAULT_VARIANT = "base"
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


def resources_over_defaults(resources: Mapping[str, Any] | None) -> dict[str, float]:
    """What each run asks for: ``cpus`` and ``gpus``, ``resources`` (a study file's) over the defaults."""
    return {**DEFAULT_RESOURCES, **{key: float(value) for key, value in (resources or {}).items()}}


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
        return resources_over_defaults(self.resources)

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
            try:
                run.config.check_game()  # each run's game settings against its game (a grid may vary them)
                if references in checked:
                    continue
                checked.add(references)
                run.config.check_references()
            except ConfigError as error:
                raise ConfigError(f"{self._where(run.variant, run.axes, run.seed)}: {error}") from error

    def _where(self, variant: str, axes: Mapping[str, Any], seed: int) -> str:
        where = [f"study {self.name}"]
        if self.variants != {DEFAULT_VARIANT: []}:  # a study without variants of its own has only the base config
            where.append(f"variant {variant!r}")
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
    study = Study(name=name, base=read_base(data.get("base"), root))
    study.overrides = read_overrides(data.get("overrides", []), "overrides")
    variants = data.get("variants", {DEFAULT_VARIANT: []})
    if is_empty(variants):
        fix = "give one variant or more (name: [overrides]), or leave variants out for one run of the base config"
        raise no_runs("variants", variants, f"{fix} per seed")
    if not isinstance(variants, Mapping):
        raise ConfigError(f"study variants must be a non-empty mapping of name: [overrides], got {variants!r}")
    study.variants = {}
    for variant, overrides in variants.items():
        if not isinstance(variant, str) or not variant:
            raise ConfigError(f"study variant names must be non-empty strings, got {variant!r}")
        study.variants[variant] = read_overrides(overrides if overrides is not None else [], f"variants.{variant}")
    study.grid = read_grid(data.get("grid", {}))
    study.seeds = read_seeds(data.get("seeds", [0]))
    study.compare = read_compare(data.get("compare", []), list(study.variants))
    study.resources = read_resources(data.get("resources", {}))
    return study
