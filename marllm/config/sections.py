"""The sections of a training config other than the algorithms' and the task's: the model, the env, the agents and
logging, each checked when built (:class:`marllm.config.TrainConfig` puts them together)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from marllm.envs.turns import TURN_REWARDS, check_roles, check_turns
from marllm.models.devices import check_device_name, check_dtype_name
from marllm.models.lora_settings import LoraSettings
from marllm.utils.checks import choice


@dataclass
class ModelConfig:
    """The base model every learner starts from (and the frozen reference).

    Attributes:
        name_or_path: any ``AutoModelForCausalLM`` hub id or local directory, ``marllm:offline-base`` or
            ``marllm:smollm2-135m-instruct`` (prepared on first use).
        dtype: the policies' dtype, ``float32``, ``bfloat16`` or ``float16``. What a trained parameter costs, in
            bytes (weights + gradients + Adam's two moments): ``float32`` 4 + 4 + 8 = 16; ``float32`` with
            ``ppo.compute.autocast_dtype: bfloat16`` the same 16, plus the autocast's transient bfloat16 copies of the
            weights a forward uses (2); ``bfloat16`` without ``lora`` 2 + 2 + 4 = 8, trained by an Adam that computes
            each step in float32 and writes the weights and moments back with stochastic rounding (unbiased, where
            rounding to nearest would lose PPO's small updates:
            :class:`~marllm.algorithms.stochastic_rounding.StochasticRoundingAdam`); ``float16`` without ``lora``
            is refused (Adam's squared gradients underflow its range). With ``lora`` the frozen base costs its dtype's
            bytes (2 or 4; 0.5 in 4 bits) and each trained adapter parameter 16 (peft keeps adapters in float32).
        reference_dtype: the dtype of the frozen reference (null: ``dtype``), which costs its bytes per parameter
            once per base (no gradients nor optimiser state): a ``bfloat16`` reference of a ``float32`` policy halves
            it, its log-probs (computed in float32 from its bfloat16 logits) then rounded to bfloat16's ~3
            significant digits. With ``lora`` the reference is the base itself with adapters disabled: null or
            ``dtype`` only.
        device: ``auto`` (CUDA if available), ``cpu`` or ``cuda``.
        lora: make every learner a LoRA adapter on one shared base (the reference is the base with adapters
            disabled); null gives each learner a full copy of the model and one shared frozen reference.
        load_in_4bit: load the base in 4 bits (needs CUDA, bitsandbytes and ``lora``).
        trust_remote_code: let transformers run the Python code a hub model ships with its weights (only for a
            model whose code you trust; a model that needs it fails to load without it).
        fsdp: on a data-parallel run (``--nproc N``), shard every policy, its value head and Adam state, and the
            shared reference over the N ranks (FSDP2), for models too large for one device; each rank loads the
            model on the CPU and keeps 1/N of it on its device. Full models only (not with ``lora``).
        fsdp_compute_dtype: with ``fsdp``, the dtype of the gathered weights that forwards and backwards compute
            in (``bfloat16`` or ``float16``; gradients are still summed in float32 into the ``dtype`` shards Adam
            updates); null computes in ``dtype``.
        fsdp_gather_for_generation: with ``fsdp``, gather a model's whole weights once for each ``generate`` call
            (the rank holds the whole model in its compute dtype while it generates) rather than layer by layer at
            every token; false for a model whose weights do not fit one device whole.
    """

    name_or_path: str = "gpt2-large"
    dtype: str = "float32"
    reference_dtype: str | None = None
    device: str = "auto"
    lora: LoraSettings | None = None
    load_in_4bit: bool = False
    trust_remote_code: bool = False
    fsdp: bool = False
    fsdp_compute_dtype: str | None = None
    fsdp_gather_for_generation: bool = True

    def __post_init__(self) -> None:
        if not self.fsdp_gather_for_generation and not self.fsdp:
            raise ValueError("model.fsdp_gather_for_generation applies to sharded models: set model.fsdp: true")
        if self.fsdp_compute_dtype is not None:
            if not self.fsdp:
                raise ValueError("model.fsdp_compute_dtype applies to sharded models: set model.fsdp: true, or null it")
            try:
                check_dtype_name(self.fsdp_compute_dtype)
            except ValueError as error:
                raise ValueError(f"model.fsdp_compute_dtype: {error}") from None
        if self.fsdp and self.lora is not None:
            raise ValueError(
                "model.fsdp shards full models; with model.lora the base is frozen and only small adapters train, "
                "so set model.fsdp: false (or model.lora: null to shard full models)"
            )
        if self.load_in_4bit and self.lora is None:
            raise ValueError("model.load_in_4bit needs model.lora: 4-bit base weights are not trained directly")
        try:
            check_device_name(self.device)
        except ValueError as error:
            raise ValueError(f"model.device: {error}") from error
        if self.reference_dtype is not None:
            try:
                check_dtype_name(self.reference_dtype)
            except ValueError as error:
                raise ValueError(f"model.reference_dtype: {error}") from None
            if self.lora is not None and self.reference_dtype != self.dtype:
                raise ValueError(
                    f"model.reference_dtype {self.reference_dtype} with model.lora: the reference is the shared base "
                    f"(model.dtype {self.dtype}) with its adapters disabled, so it has the base's dtype; set "
                    "model.reference_dtype: null"
                )
        if self.dtype == "float16" and self.lora is None:
            # Adam's second moment, the squared gradient, underflows float16 (smallest 6e-8) for gradients below 2e-4.
            raise ValueError(
                "model.dtype float16 with model.lora: null would train every weight in float16, where Adam's squared "
                "gradients underflow; use model.dtype: bfloat16 (trained with stochastic rounding) or float32 for "
                "full-parameter training, or set model.lora (its adapters are kept in float32 on a float16 base)"
            )
        if self.dtype == "bfloat16" and self.lora is None and self.fsdp:
            raise ValueError(
                "model.dtype bfloat16 with model.lora: null and model.fsdp: sharded models are not trained with "
                "stochastic rounding; use model.dtype: float32 with model.fsdp_compute_dtype: bfloat16"
            )


@dataclass
class EnvConfig:
    """The sequential text environment.

    Attributes:
        roles: speaking order; ``[pioneer, observer]`` for CORY, ``[pioneer]`` for single-agent PPO.
        templates: prompt template per role (``str.format`` over sample fields, earlier roles and earlier turn names
            ``<role>_<k>``), or per turn under its turn name; null takes the task's defaults.
        turns: the speaking order when a role speaks more than once, e.g. ``[proposer, critic, proposer]``; null is
            one turn per role in ``roles`` order.
        turn_rewards: ``each`` (every turn is credited with its own response's reward) or ``last`` (every turn of a
            role with its last response's reward).
        batch_size: dialogues per episode (= samples per PPO batch).
        group_size: each query is asked this many times in consecutive dialogues (``batch_size / group_size``
            queries per batch): the groups GRPO and RLOO compare. Must divide ``batch_size``.
    """

    roles: list[str] = field(default_factory=lambda: ["pioneer", "observer"])
    templates: dict[str, str] | None = None
    batch_size: int = 256
    group_size: int = 1
    turns: list[str] | None = None
    turn_rewards: str = "each"

    def __post_init__(self) -> None:
        self.roles = check_roles(self.roles)
        check_turns(self.turns, self.roles)
        choice("env", self, "turn_rewards", TURN_REWARDS)
        if self.batch_size < 1:
            raise ValueError(f"env.batch_size must be >= 1, got {self.batch_size}")
        if self.group_size < 1 or self.batch_size % self.group_size:
            raise ValueError(f"env.group_size must be >= 1 and divide env.batch_size ({self.batch_size}), got "
                             f"{self.group_size}")


@dataclass
class AgentsConfig:
    """Who plays, on which reward, and how roles rotate.

    Attributes:
        learners: learner ids, one per role (default ``llm1 … llmN``); learner i starts in role i.
        reward_coefficients: the SharedReward matrix C (agent i gets Σ_j C[i][j] r_j), or a number λ for
            ``C = [[1, λ], [λ, 1]]`` (generalised to N), or null for no sharing (each agent its own reward).
            CORY: 1.0 (r1 + r2).
        role_period: resets between role permutations (CORY's T_REx = 5); null never permutes.
        models: per learner id, the base model it starts from (a hub id, a local directory or a ``marllm:`` causal
            LM), each with its own tokenizer and frozen reference; learners not named start from
            ``model.name_or_path``, whose tokenizer also cuts the task's queries. Agents of different bases talk
            through text only.
        algorithm: how every learner learns, ``ppo``, ``grpo``, ``rloo`` or ``reinforce_pp``
            (:data:`marllm.algorithms.catalog.ALGORITHM_REGISTRY`) or a learner class by reference
            (``my_learner.py:MyPPO``, relative to the config's folder, or ``package.module:MyPPO``), or a mapping
            learner id -> algorithm (learners not named use ``ppo``). The ``ppo`` section's optimisation settings
            apply to all; ``critic_free`` holds the GRPO family's own.
        devices: one agent per device: a list of device names in ``learners`` order, or a mapping learner id ->
            device (learners not named use ``model.device``). Each learner's policy lives on its device; learners
            on distinct devices update concurrently. Learners sharing one LoRA base share its device.
        reference_device: where the frozen reference of full-model learners lives (null: ``model.device``); each
            learner's rollout is scored against it there.
    """

    learners: list[str] | None = None
    reward_coefficients: list[list[float]] | float | None = None
    role_period: int | None = None
    models: dict[str, str] | None = None
    algorithm: str | dict[str, str] = "ppo"
    devices: list[str] | dict[str, str] | None = None
    reference_device: str | None = None

    def __post_init__(self) -> None:
        names = list(self.devices.values()) if isinstance(self.devices, dict) else list(self.devices or [])
        for name in [*names, *([self.reference_device] if self.reference_device is not None else [])]:
            try:
                check_device_name(name)
            except ValueError as error:
                raise ValueError(f"agents.devices / agents.reference_device: {error}") from error
        if self.role_period is not None and self.role_period < 1:
            raise ValueError(f"agents.role_period must be an int >= 1 or null, got {self.role_period}")
        if isinstance(self.reward_coefficients, float) and not math.isfinite(self.reward_coefficients):
            raise ValueError(
                f"agents.reward_coefficients must be a finite number λ, a matrix of finite numbers or null, got "
                f"{self.reward_coefficients}"
            )


@dataclass
class LoggingConfig:
    """What the run writes besides ``metrics.jsonl``.

    Attributes:
        tensorboard: also write TensorBoard scalars under ``RUN_DIR/tensorboard``.
        samples_per_iteration: dialogues per iteration written to ``samples.jsonl``.
        eval_queries: held-out queries answered by the base model and each trained agent deployed alone at the
            end (``eval_samples.jsonl``); 0 skips it.
        save_checkpoint: export each learner (policy in Hugging Face format, value head, optimiser) to
            ``RUN_DIR/checkpoints/LEARNER`` when training ends, before any end-of-run evaluation (what
            ``marllm eval --checkpoint`` reads).
        checkpoint_every: write the training state (every learner, the env chain, the random generators) to
            ``RUN_DIR/training_state/`` every this many iterations, so that ``marllm train --resume`` can continue
            the run; null writes it only when the run ends or is interrupted. It is always written then.
        keep_checkpoints: how many of the newest training-state checkpoints are kept (older ones are deleted).
        progress: show a progress bar.
        pass_at_k: for tasks with a 0/1 reward, the k values of pass@k measured for the base model and each agent
            deployed alone at the end of the run (``pass_at_k.json``); null skips it.
        pass_at_k_samples: samples per problem (n of the unbiased estimator, >= every k).
        pass_at_k_problems: how many eval-split problems (null: all).
    """

    tensorboard: bool = True
    samples_per_iteration: int = 4
    eval_queries: int = 16
    save_checkpoint: bool = True
    progress: bool = True
    pass_at_k: list[int] | None = None
    pass_at_k_samples: int = 1
    pass_at_k_problems: int | None = None
    checkpoint_every: int | None = 10
    keep_checkpoints: int = 2

    def __post_init__(self) -> None:
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise ValueError(
                f"logging.checkpoint_every must be >= 1, or null to checkpoint only at the end, got "
                f"{self.checkpoint_every}"
            )
        if self.keep_checkpoints < 1:
            raise ValueError(f"logging.keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        for key in ("samples_per_iteration", "eval_queries"):
            if getattr(self, key) < 0:
                raise ValueError(f"logging.{key} must be >= 0 (0 writes none), got {getattr(self, key)}")
        if self.pass_at_k_samples < 1:
            raise ValueError(f"logging.pass_at_k_samples must be >= 1, got {self.pass_at_k_samples}")
        if self.pass_at_k_problems is not None and self.pass_at_k_problems < 1:
            raise ValueError(
                f"logging.pass_at_k_problems must be >= 1, or null for every problem, got {self.pass_at_k_problems}"
            )
        if self.pass_at_k is not None:
            bad = [k for k in self.pass_at_k if not 1 <= k <= self.pass_at_k_samples]
            if not self.pass_at_k or bad:
                raise ValueError(
                    f"logging.pass_at_k needs 1 <= k <= logging.pass_at_k_samples ({self.pass_at_k_samples}), "
                    f"got {self.pass_at_k}"
                )
