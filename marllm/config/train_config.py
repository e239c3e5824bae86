"""The whole training config, :class:`TrainConfig` (importable from :mod:`marllm.config`): its sections put together,
and the checks that span them (learners and roles, algorithms, devices, a game's batches, data-parallel runs)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from marllm.algorithms.catalog import check_algorithm, compares_groups
from marllm.algorithms.critic_free_config import CriticFreeConfig
from marllm.algorithms.ppo_config import GenerationConfig, PPOConfig
from marllm.assets import CAUSAL_LMS
from marllm.assets.references import check_model_reference
from marllm.config.loading import ConfigError, to_dict
from marllm.config.sections import AgentsConfig, EnvConfig, LoggingConfig, ModelConfig
from marllm.envs.templates import check_template_fields, check_template_keys
from marllm.envs.turns import check_shard
from marllm.games.settings import GAME_REPETITION_PENALTY, GameConfig
from marllm.models.devices import resolve_device
from marllm.tasks import TASKS, TaskConfig, has_binary_reward
from marllm.wrappers.shared_reward import check_coefficients, cooperation_matrix


@dataclass
class TrainConfig:
    """A whole run. ``name`` labels the run in reports (``ppo``, ``cory``)."""

    name: str = "run"
    seed: int = 0
    iterations: int = 100
    run_dir: str | None = None
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=lambda: TASKS["sentiment"]())
    env: EnvConfig = field(default_factory=EnvConfig)
    game: GameConfig | None = None
    agents: AgentsConfig = field(default_factory=AgentsConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    critic_free: CriticFreeConfig = field(default_factory=CriticFreeConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {self.iterations}")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be an integer in [0, 2**32 - 1], got {self.seed}")
        if self.game is not None:
            self._check_game()
        else:
            self._check_text_env()
        if self.agents.models is not None:
            self._check_learner_keys("agents.models", self.agents.models)
            bad = {k: v for k, v in self.agents.models.items() if not isinstance(v, str) or not v.strip()}
            if bad:
                raise ValueError(f"agents.models must map learner ids to model names or paths, got {bad}")
        self._check_algorithms()
        self._check_devices()
        if self.ppo.compute.autocast_dtype is not None and self.ppo.compute.autocast_dtype == self.model.dtype:
            # the model section and the update's compute meet here: the one rule that joins them
            raise ValueError(
                f"ppo.compute.autocast_dtype: {self.ppo.compute.autocast_dtype} would change nothing: model.dtype is "
                f"{self.model.dtype} already, so every forward computes in it; set ppo.compute.autocast_dtype: null"
            )
        clash = set(self.learner_ids) & set(self.env.roles)
        if clash and self.learner_ids != self.env.roles and self.game is None:
            raise ValueError(f"agents.learners {sorted(clash)} are also role names in env.roles; use distinct ids")
        if self.game is None:  # a game's matrix is checked against its seats with the game (check_game)
            self._check_coefficients()
        if self.logging.pass_at_k is not None and not has_binary_reward(self.task):
            raise ValueError(
                f"logging.pass_at_k needs a task with a 0/1 reward, not {self.task.name!r} (a task says so with "
                "binary_reward; the text task's is task.binary_reward)"
            )
        check_roles = getattr(self.task, "check_roles", None)
        if check_roles is not None:
            check_roles(self.env.roles)
        if self.env.templates is None and not self.task.default_templates():
            raise ValueError(
                f"env.templates: task {self.task.name!r} has no default prompt templates; give one per role of "
                f"{self.env.roles} (\"{{query}}\" uses the dataset's prompt as written)"
            )
        if self.env.templates is not None:
            try:
                check_template_keys(self.env.templates, self.env.roles, self.speaking_order)
            except ValueError as error:
                raise ValueError(f"env.templates: {error}") from error
            check_template_fields(self.env.templates, self.env.roles, self.speaking_order)

    def _check_text_env(self) -> None:
        try:
            self.ppo.batching.check_batch_size(self.env.batch_size)
        except ValueError as error:
            raise ValueError(f"env.batch_size: {error}") from error
        n = len(self.env.roles)
        if self.agents.learners is not None and len(self.agents.learners) != n:
            raise ValueError(
                f"agents.learners has {len(self.agents.learners)} ids for {n} roles {self.env.roles}; give one per role"
            )
        if self.agents.learners is not None and len(set(self.agents.learners)) != n:
            raise ValueError(f"agents.learners must be distinct, got {self.agents.learners}")

    def _check_game(self) -> None:
        """A game config: no text env or task, learners named by ``game.seats``, batches PPO can split."""
        assert self.game is not None
        defaults = {f.name: f.default_factory for f in fields(self) if f.name in ("env", "task")}
        given = [name for name, default in defaults.items() if getattr(self, name) != default()]
        if given:
            raise ValueError(
                f"a config with a game section plays the game instead of the text env: leave out its "
                f"{' and '.join(given)} section{'s' if len(given) > 1 else ''} (game.batch_size and game.templates "
                "set the batch and the prompts)"
            )
        if self.agents.learners is not None:
            raise ValueError(
                f"agents.learners: with a game section the learners are the learner ids of game.seats "
                f"({self.game.learner_ids}); leave agents.learners out"
            )
        if isinstance(self.agents.algorithm, dict):
            self._check_learner_keys("agents.algorithm", self.agents.algorithm)
        for learner, name in self.learner_algorithms().items():
            if compares_groups(name):
                raise ValueError(
                    f"agents.algorithm {name} (learner {learner!r}) compares the answers to one query, and a game's "
                    "moves come in no such groups: use ppo or reinforce_pp"
                )
        self.game.check_actions(self.generation.stop_at_eos)
        facts = self.game.actions.facts
        unfit = facts.rollout_from_generate  # why the mode does not take it
        if unfit is not None and self.ppo.compute.rollout_from_generate is True:
            raise ValueError(
                "ppo.compute.rollout_from_generate: true takes the rollout's log-probs from generate, and "
                f"game.actions: {self.game.actions.mode} {unfit}; leave ppo.compute.rollout_from_generate at auto "
                "(or false), or use game.actions: generate"
            )
        if self.game.history == "sequence":  # the game's history, the mode and the algorithm meet here
            if facts.sequences is not None:
                raise ValueError(f"game.history: sequence: game.actions: {self.game.actions.mode} {facts.sequences}; "
                                 "use game.history: prompt, or a mode that samples tokens")  # fmt: skip
            others = sorted({a for a in self.learner_algorithms().values() if a != "ppo"})
            if others:
                raise ValueError(f"game.history: sequence trains with ppo (GAE across a seat's turns); "
                                 f"agents.algorithm {others} takes one outcome per answer: use ppo, or game.history: "
                                 "prompt")  # fmt: skip
        # The one rule that joins the generation section and the mode: sampling settings the mode's answers never
        # read (a game's repetition penalty defaults to GAME_REPETITION_PENALTY).
        defaults = {**to_dict(GenerationConfig()), "repetition_penalty": GAME_REPETITION_PENALTY}
        for name in facts.ignores_sampling:
            value = getattr(self.generation, name)
            if value != defaults[name]:
                raise ValueError(
                    f"generation.{name}: {value} would be ignored: under game.actions: {self.game.actions.mode} (its "
                    f"answer: {facts.summary}) no token is sampled; leave generation.{name} at its default "
                    f"({defaults[name]}), or use a mode that samples tokens"
                )
        if self.logging.pass_at_k is not None:
            raise ValueError(
                "logging.pass_at_k measures answers to a task's problems; a game config has none (marllm eval "
                "measures a game's win, draw and loss rates)"
            )

    def _check_coefficients(self) -> None:
        try:
            self.coefficient_matrix()
        except ValueError as error:
            raise ValueError(f"agents.reward_coefficients: {error}") from error

    def check_game(self) -> None:
        """The checks of a game config that need the game itself (:meth:`GameConfig.check_game
        <marllm.games.settings.GameConfig.check_game>`; the reward matrix against its seats, PPO's batches against how
        its moves come): run before anything loads, by :meth:`check_references`, as reading a config builds no game.

        Raises:
            ConfigError: naming the key.
        """
        if self.game is None:
            return
        try:
            self.game.check_game()
            self._check_coefficients()
            self._check_game_batches()
        except ValueError as error:
            raise error if isinstance(error, ConfigError) else ConfigError(str(error)) from None

    def _check_game_batches(self) -> None:
        """PPO splits a learner's moves of an iteration into whole mini-batches unless
        ``ppo.batching.last_minibatch`` is ``merge``; how many moves an iteration holds depends on the game."""
        assert self.game is not None
        game, batching = self.game, self.ppo.batching
        step = batching.backward_batch_size
        lockstep = game.info.lockstep and game.illegal == "random"
        if step == 1 or batching.last_minibatch == "merge" or (lockstep and game.batch_size % step == 0):
            return
        sizes = f"ppo.batching.mini_batch_size × ppo.batching.gradient_accumulation_steps = " \
                f"{batching.mini_batch_size} × {batching.gradient_accumulation_steps} = {step}"  # fmt: skip
        if lockstep:
            raise ValueError(
                f"game.batch_size {game.batch_size} is not divisible by {sizes} (or set ppo.batching.last_minibatch: "
                "merge)"
            )
        why = (
            "an illegal answer ends its game early (game.illegal: forfeit)"
            if game.info.lockstep
            else f"the games of a batch of {game.name} end after different numbers of moves"
        )
        also = " (or game.illegal: random, with which every move covers every game)" if game.info.lockstep else ""
        raise ValueError(
            f"{sizes} must be 1 for this game: {why}, so a seat's move covers a varying number of games, and PPO "
            "splits a learner's moves into whole mini-batches; set ppo.batching.last_minibatch: merge (the rows left "
            "over join the last mini-batch), or ppo.batching.mini_batch_size: 1 and "
            f"ppo.batching.gradient_accumulation_steps: 1{also}"
        )

    def _check_learner_keys(self, key: str, mapping: Mapping[str, Any]) -> None:
        unknown = sorted(set(mapping) - set(self.learner_ids))
        if unknown:
            raise ValueError(f"{key} names unknown learner(s) {unknown}; the learners are {self.learner_ids}")

    def _check_algorithms(self) -> None:
        if isinstance(self.agents.algorithm, dict):
            self._check_learner_keys("agents.algorithm", self.agents.algorithm)
        for learner, name in self.learner_algorithms().items():
            check_algorithm(name, f"agents.algorithm of {learner!r}")
            if compares_groups(name) and self.env.group_size < 2:
                raise ValueError(
                    f"agents.algorithm {name} (learner {learner!r}) compares the responses to one query: set "
                    f"env.group_size >= 2, got {self.env.group_size}"
                )
            unscaled = name == "rloo" or (name == "grpo" and not self.critic_free.scale_by_std)
            if unscaled and self.ppo.score_transform != "none":
                warnings.warn(
                    f"learner {learner!r}: {'Dr. GRPO' if name == 'grpo' else 'RLOO'} with ppo.score_transform: "
                    f"{self.ppo.score_transform} rescales every advantage by a running std that drifts over training, "
                    "which the method does not; set ppo.score_transform: none for the method as published",
                    stacklevel=2,
                )

    def _check_devices(self) -> None:
        devices = self.agents.devices
        if isinstance(devices, list) and len(devices) != len(self.learner_ids):
            raise ValueError(
                f"agents.devices lists {len(devices)} device(s) for {len(self.learner_ids)} learners "
                f"{self.learner_ids}; give one per learner, or a mapping learner id -> device"
            )
        if isinstance(devices, dict):
            self._check_learner_keys("agents.devices", devices)
        if devices and self.model.lora is not None:
            placed = self.learner_devices()
            for base in set(self.learner_models().values()):
                on = sorted({placed[learner] for learner, model in self.learner_models().items() if model == base})
                if len(on) > 1:
                    raise ValueError(
                        f"agents.devices puts the LoRA learners of {base} on {on}, but they share one base model: "
                        "give them one device, or use full-model learners (model.lora: null)"
                    )

    def check_placement(self, world_size: int) -> None:
        """Whether this run can train on ``world_size`` data-parallel processes: its batch splits into whole groups,
        one slice per process, and it places no agent on a device of its own (each rank takes one GPU); and
        ``model.fsdp`` has more than one process to shard over.

        Raises:
            ConfigError: naming the setting that does not fit.
        """
        if world_size > 1 and self.game is not None:
            raise ConfigError(
                f"a game config trains on one process (the batched game is not split over ranks), not {world_size}: "
                "leave out --nproc"
            )
        if world_size <= 1:
            if self.model.fsdp:
                raise ConfigError(
                    "model.fsdp shards the models over the processes of a data-parallel run, and this is one "
                    "process: start it with marllm train --nproc N (N >= 2), or set model.fsdp: false"
                )
            return
        whole_model_only = self.ppo.compute.whole_model_settings() if self.model.fsdp else []
        if whole_model_only:
            raise ConfigError(f"{'; '.join(whole_model_only)}: leave these at their defaults with model.fsdp")
        try:
            check_shard((0, world_size), self.env.batch_size, self.env.group_size)
        except ValueError as error:
            raise ConfigError(f"env.batch_size on {world_size} processes: {error}") from None
        if self.agents.devices is not None or self.agents.reference_device is not None:
            raise ConfigError(
                "agents.devices / agents.reference_device place agents on devices of one process; data-parallel "
                "ranks each take the GPU of their LOCAL_RANK: leave them unset with --nproc"
            )

    def learner_devices(self) -> dict[str, str]:
        """Each learner's device: ``agents.devices`` (a list in learner order, or per learner id), else
        ``model.device``."""
        devices = self.agents.devices
        if isinstance(devices, list):
            return dict(zip(self.learner_ids, devices, strict=True))
        return per_learner(devices or {}, self.learner_ids, self.model.device)

    def learner_algorithms(self) -> dict[str, str]:
        """Each learner's algorithm: ``agents.algorithm`` (one for all, or per learner id; ``ppo`` if not named)."""
        return per_learner(self.agents.algorithm, self.learner_ids, "ppo")

    def learner_models(self) -> dict[str, str]:
        """The base model of each learner: ``agents.models``, else ``model.name_or_path``."""
        return per_learner(self.agents.models or {}, self.learner_ids, self.model.name_or_path)

    @property
    def learner_ids(self) -> list[str]:
        if self.game is not None:
            return self.game.learner_ids
        return self.agents.learners or [f"llm{i + 1}" for i in range(len(self.env.roles))]

    def coefficient_matrix(self) -> Any:
        """The SharedReward matrix, or None when rewards are not shared."""
        c = self.agents.reward_coefficients
        if c is None:
            return None
        agents = list(self.game.info.seats) if self.game is not None else self.env.roles  # a game's seats
        if isinstance(c, float):
            return cooperation_matrix(len(agents), c)
        return check_coefficients(c, agents)

    def check_references(self) -> None:
        """Check that the model, reward model, dataset and device the config names exist on this machine, before
        anything loads (a config itself loads anywhere, e.g. a GPU config on a CPU machine).

        Raises:
            ConfigError: naming the key whose path does not exist, whose hub id is not in the local cache while the
                hub is offline, or whose device this machine lacks; or a game's setting that does not fit the game
                (:meth:`check_game`).
        """
        self.check_game()
        placed = {f"agents.devices.{learner}": device for learner, device in (self.learner_devices()).items()}
        if self.agents.reference_device is not None:
            placed["agents.reference_device"] = self.agents.reference_device
        for key, device in {"model.device": self.model.device, **placed}.items():
            try:
                resolve_device(device)
            except ValueError as error:
                raise ConfigError(f"{key}: {error}") from error
        check_model_reference(self.model.name_or_path, "model.name_or_path", asset=CAUSAL_LMS)
        for learner, model in (self.agents.models or {}).items():
            check_model_reference(model, f"agents.models.{learner}", asset=CAUSAL_LMS)
        if self.game is None:  # a game config has no task
            self.task.check_references()

    @property
    def speaking_order(self) -> list[str]:
        """``env.turns``, or each role once in ``env.roles`` order."""
        return list(self.env.turns) if self.env.turns is not None else list(self.env.roles)

    def role_templates(self, defaults: Mapping[str, str] | None = None) -> dict[str, str]:
        """The prompt templates by role (and by turn name where a turn has its own): ``env.templates``, else
        ``defaults`` (a built task's templates; by default the task config's).

        Raises:
            ValueError: the task has no default template for some role and ``env.templates`` is not given.
        """
        if self.env.templates is not None:
            return dict(self.env.templates)
        if defaults is None:
            defaults = self.task.default_templates()
        missing = [r for r in self.env.roles if r not in defaults]
        if missing:
            raise ValueError(
                f"the task has default templates for roles {sorted(defaults)} only; give env.templates for {missing}"
            )
        return {role: defaults[role] for role in self.env.roles}

    def deployed_template(self) -> str:
        """The prompt of an agent deployed alone: the first role's template (CORY's pioneer: the query only)."""
        return self.role_templates()[self.env.roles[0]]

    def resolved_run_dir(self) -> Path:
        return Path(self.run_dir) if self.run_dir else Path("runs") / self.name

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


def per_learner(setting: str | Mapping[str, str], learner_ids: Sequence[str], default: str) -> dict[str, str]:
    """A value for every learner id: ``setting`` itself for all, or per id from a mapping (``default`` where the
    mapping does not name the id)."""
    if isinstance(setting, str):
        return dict.fromkeys(learner_ids, setting)
    return {learner: setting.get(learner, default) for learner in learner_ids}
