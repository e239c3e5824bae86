"""Training runs: :func:`train` drives :func:`~marllm.loop.run_iteration` over a run directory.

It builds the run from its config (:func:`marllm.run.setup.build`), starts it or resumes it from its latest checkpoint,
logs each iteration's metrics and sample dialogues, checkpoints the training state, stops cleanly on a signal or on
too many skipped updates, and ends with the learners' export and the evaluation of each agent deployed alone
(:mod:`marllm.evaluation.deployed`). ``run.json`` records how far the run got.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from tqdm.auto import tqdm

from marllm.config import CONFIG_LAYOUT, TrainConfig
from marllm.evaluation.deployed import evaluate_alone, evaluate_pass_at_k_alone
from marllm.loop import run_iteration
from marllm.parallel.distributed import launched_rank
from marllm.parallel.placement import Placement
from marllm.run.checkpoint import CheckpointInfo, save_checkpoint
from marllm.run.interrupts import StopSignals, TrainingInterrupted
from marllm.run.measures import exploitability_measure, kl_metric
from marllm.run.parts import Setup
from marllm.run.resume import check_run_dir_exists, checkpoint_to_resume, load_to_resume, offline_assets_record
from marllm.run.run_dir import (
    CONFIG_FILE,
    END_OF_RUN_FILES,
    EVAL_FILE,
    EXPORT_DIR,
    METRICS_FILE,
    PASS_AT_K_FILE,
    RUN_FILE,
    RUN_FILES,
    SAMPLES_FILE,
    RunDirError,
    check_can_overwrite,
    check_can_start,
    hold_run_dir,
    keep_iterations_before,
    overwrite_run_files,
    read_run_info,
    refuse_a_file,
    remove_run_files,
    run_entries,
    update_run_info,
    write_atomic,
    write_run_info,
)
from marllm.run.run_log import RunLog, sample_rows
from marllm.run.setup import build, run_placement
from marllm.run.skip_streaks import count_skips, skip_streaks
from marllm.utils.imports import package_version


@dataclass
class TrainResult:
    """What :func:`train` returns: the run directory, every iteration's metrics (for a resumed run, also those
    logged before the checkpoint it resumed from) and the end-of-run evaluation rows."""

    run_dir: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    eval_rows: list[dict[str, Any]] = field(default_factory=list)


def train(
    config: TrainConfig, run_dir: str | Path | None = None, resume: bool = False, overwrite: bool = False
) -> TrainResult:
    """Train for ``config.iterations`` iterations, logging to ``run_dir`` (default ``config.run_dir``).

    Args:
        config: the run.
        run_dir: where it is written (see :mod:`marllm.run.run_dir`); created if needed (and removed again if
            the run stops before its first iteration is logged).
        resume: continue the run in ``run_dir`` from its latest training checkpoint. Its logs are cut back to that
            iteration and the run goes on to ``config.iterations``, exactly as if it had not stopped. ``config``
            must match the checkpoint's in everything but :data:`marllm.config.RESUMABLE_KEYS`.
        overwrite: delete the files of the run already in ``run_dir`` and its ``report/`` (marllm's own only, named in
            a warning first; another warning lists the others left in its directories) and start again. Refused,
            with nothing deleted, where ``run_dir`` holds no run of marllm's but files under marllm's names, or a
            user's file inside a learner's export (:func:`~marllm.run.run_dir.check_can_overwrite`).

    The process owns ``run_dir`` while it trains (:func:`~marllm.run.run_dir.hold_run_dir`): another process that
    trains into it meanwhile is refused before it changes anything. Without ``resume`` or ``overwrite``, a
    ``run_dir`` that already holds a run, or files under the names marllm writes, is an error. The training state is
    checkpointed every ``logging.checkpoint_every`` iterations and when training ends; the learners are exported and
    that last checkpoint written before any end-of-run evaluation. ``run.json`` records the run's status.

    SIGINT or SIGTERM stops the run after its current iteration, with a checkpoint, by raising
    :class:`~marllm.run.interrupts.TrainingInterrupted`; a second signal stops it at once. The previous signal handlers
    are restored on return. A new run that stops before its first iteration is logged leaves nothing behind: the
    files and the directories it created are removed again.

    Started by torchrun with several processes (``marllm train --nproc N``), it joins their process group and trains
    data-parallel under the placement chosen at setup (:func:`~marllm.run.setup.run_placement`): each rank plays
    its slice of every batch, and rank 0 alone writes the run directory; with whole models it alone evaluates at the
    end, and the others return a result without evaluation. With ``model.fsdp`` the models are split over the ranks
    (:class:`~marllm.parallel.placement.Sharded`), whose ranks run in lockstep: every rank joins the gathering of the
    states rank 0 writes and the end-of-run evaluation's forwards. A stop signal stops every rank after the same
    iteration.

    Raises:
        RunDirError: ``run_dir`` holds a run (and neither flag is given), or there is nothing to resume.
        DirectoryInUseError: another process owns ``run_dir`` (the message names its PID).
        ConfigError: resuming with a config that changes what is trained.
        CheckpointError: the checkpoint to resume from does not load (a damaged file: the run is left as it was, and
            the message says what can be done), or a checkpoint cannot be written (a full disk: the run is recorded
            as failed, the checkpoints before it stay).
    """
    run_dir = Path(run_dir) if run_dir is not None else config.resolved_run_dir()
    if resume and overwrite:
        raise RunDirError("resume and overwrite exclude each other: resume continues the run, overwrite deletes it")
    refuse_a_file(run_dir)
    if resume:
        check_run_dir_exists(run_dir)
    # Rank 0 owns the directory for the whole run (the other ranks of a data-parallel run write nothing there).
    owner = hold_run_dir(run_dir) if launched_rank() == 0 else contextlib.nullcontext(None)
    with owner as created:
        return _train_owned(config, run_dir, resume, overwrite, created)


def _train_owned(
    config: TrainConfig, run_dir: Path, resume: bool, overwrite: bool, created: Path | None
) -> TrainResult:
    """:func:`train` in the run directory it owns (``created``: the outermost directory created for it, removed
    again if the run stops before it begins)."""
    placement = Placement()
    run: _Run | None = None
    try:
        checkpoint = checkpoint_to_resume(run_dir, config) if resume else None
        if overwrite:  # refused before anything is built or deleted
            check_can_overwrite(run_dir)
        elif not resume:
            check_can_start(run_dir)
        placement = run_placement(config)
        placement.barrier()  # every rank has checked the run directory before rank 0 writes to it
        setup = build(config, placement)
        with StopSignals() as stop:
            run = _Run(config, setup, run_dir, fresh=checkpoint is None, created=created)
            try:
                _open_run(run, checkpoint, overwrite)
                _train_iterations(run, stop)
                _end_training(run, stop)
                return run.result
            except BaseException as error:
                stopped = _record_stop(run, error)
                if stopped is error:
                    raise
                raise stopped from None
    except BaseException:
        if run is None and created is not None:  # stopped before the run began: leave nothing behind
            shutil.rmtree(created, ignore_errors=True)
        raise
    finally:
        placement.close()


@dataclass
class _Run:
    """A run in progress: what it trains, where it writes, how far it got."""

    config: TrainConfig
    setup: Setup
    run_dir: Path
    fresh: bool  # started by this call (not resumed)
    created: Path | None = None  # the outermost directory this call created
    preexisting: frozenset[Path] = frozenset()  # marllm's files and directories in run_dir before a fresh run began
    opened: bool = False  # a resumed run's checkpoint has loaded: from here on it changes run_dir
    completed: int = 0
    checkpointed: int | None = None  # the iteration of the latest training checkpoint
    streaks: dict[str, int] = field(default_factory=dict)  # consecutive skipped updates per learner
    result: TrainResult = field(init=False)

    def __post_init__(self) -> None:
        self.result = TrainResult(self.run_dir)

    @property
    def writes(self) -> bool:
        """Whether this process writes the run directory: one process, or rank 0 of a data-parallel run."""
        return self.setup.placement.writes


def _open_run(run: _Run, checkpoint: CheckpointInfo | None, overwrite: bool) -> None:
    """Load the checkpoint of a resumed run, or clear the way for a new one; write config.yaml and run.json."""
    config, run_dir = run.config, run.run_dir
    info = _run_info(config)
    if checkpoint is not None:
        loaded = load_to_resume(run_dir, checkpoint, run.setup.learners, run.setup.env, run.setup.hooks)
        run.completed = run.checkpointed = loaded.iteration
        run.opened = True
        run.setup.placement.reseed_sampling(config.seed, loaded.iteration)
        # Rank 0 rewrites the log atomically, and every rank keeps the same lines of it whichever version it reads.
        run.result.history = keep_iterations_before(run_dir / METRICS_FILE, loaded.iteration, rewrite=run.writes)
        run.streaks = skip_streaks(run.result.history, list(run.setup.learners))
        if not run.writes:
            return
        remove_run_files(run_dir, END_OF_RUN_FILES)
        keep_iterations_before(run_dir / SAMPLES_FILE, loaded.iteration)
        previous = read_run_info(run_dir)
        info["resumed_from"] = [*previous.get("resumed_from", []), loaded.iteration]
        info["checkpoint_iteration"] = loaded.iteration
    elif not run.writes:
        return
    else:
        if overwrite:
            overwrite_run_files(run_dir)
        present = [run_dir / name for name in RUN_FILES if (run_dir / name).exists()]
        run.preexisting = frozenset([*present, *run_entries(run_dir)])
    measure = exploitability_measure(config)
    header = f"# exploitability of {measure}\n" if measure is not None else ""  # a comment: the file still loads
    (run_dir / CONFIG_FILE).write_text(header + yaml.safe_dump(config.to_dict(), sort_keys=False))
    write_run_info(run_dir, {**info, "status": "running", "completed_iterations": run.completed})


def _run_info(config: TrainConfig) -> dict[str, Any]:
    return {
        "config_layout": CONFIG_LAYOUT,
        "marllm_version": package_version("marllm"),
        "name": config.name,
        "learners": config.learner_ids,
        "roles": list(config.game.info.seats) if config.game is not None else config.env.roles,  # a game's seats
        "iterations": config.iterations,
        "kl_metric": kl_metric(config),
        **({"exploitability_of": measure} if (measure := exploitability_measure(config)) is not None else {}),
        **({"offline_assets": assets} if (assets := offline_assets_record(config)) is not None else {}),
    }


def _train_iterations(run: _Run, stop: StopSignals) -> None:
    """Run the iterations from ``run.completed`` to ``iterations``, logging and checkpointing each as due; stop
    (with a checkpoint) once a signal asks."""
    config, setup = run.config, run.setup
    log = RunLog(run.run_dir, run.completed, config.logging.tensorboard) if run.writes else None
    with log or contextlib.nullcontext():
        bar = tqdm(
            range(run.completed, config.iterations),
            desc=f"{config.name}",
            initial=run.completed,
            total=config.iterations,
            disable=not config.logging.progress or not run.writes,
        )
        for iteration in bar:
            if _stop_requested(run, stop):
                break
            # A new run seeds the env once; a resumed one continues the env's generator from the checkpoint.
            seed = config.seed if run.fresh and iteration == 0 else None
            result = run_iteration(setup.env, setup.players, seed, setup.concurrent_updates, setup.metric_names)
            metrics, dialogues = result
            metrics = setup.iteration_metrics({"iteration": iteration, **metrics}, result.final_infos)
            run.result.history.append(metrics)
            run.completed = iteration + 1
            if log is not None:
                log.write(iteration, metrics, sample_rows(dialogues, iteration, config.logging.samples_per_iteration))
                update_run_info(run.run_dir, completed_iterations=run.completed)
            count_skips(run.streaks, setup.learners, metrics, config.ppo.guards.max_consecutive_skips, run.checkpointed)
            if _checkpoint_due(run):
                _save_training_state(run)
            bar.set_postfix(
                {
                    f"{lid}": f"r={metrics[f'{lid}/task_reward']:.2f} kl={metrics[f'{lid}/kl']:.2f}"
                    for lid in setup.learners
                    if f"{lid}/kl" in metrics  # a game's fixed opponents, or a learner that did not move
                }
            )
    if _stop_requested(run, stop):  # a signal during the last iteration, on any rank
        _stop_gracefully(run, stop)


def _stop_requested(run: _Run, stop: StopSignals) -> bool:
    """Whether a signal asked the run to stop; data-parallel, whether it asked any rank (then every rank stops)."""
    if run.setup.placement.any(stop.requested) and not stop.requested:
        stop.received = signal.SIGTERM  # another rank's signal: stop as if this one had received it
    return stop.requested


def _checkpoint_due(run: _Run) -> bool:
    """``checkpoint_every`` iterations since the last checkpoint, and no learner in a run of skipped updates."""
    every = run.config.logging.checkpoint_every
    since = run.completed - (run.checkpointed or 0)
    return every is not None and since >= every and not any(run.streaks.values())


def _save_training_state(run: _Run) -> None:
    """Checkpoint the training state (rank 0 writes it); a save that fails (a full disk) raises CheckpointError."""
    if run.writes:
        save_checkpoint(
            run.run_dir,
            run.completed,
            run.setup.learners,
            run.setup.env,
            keep=run.config.logging.keep_checkpoints,
            extra=_checkpoint_extra(run.config),
            parts=run.setup.hooks,
        )
        update_run_info(run.run_dir, checkpoint_iteration=run.completed)
    elif run.setup.placement.lockstep:
        # Rank 0's save_checkpoint gathers each learner's state_dict in turn as it writes; every rank joins.
        for learner in run.setup.learners.values():
            learner.share_state()
    run.checkpointed = run.completed


def _checkpoint_extra(config: TrainConfig) -> dict[str, Any]:
    """What a checkpoint records beside the training state: the config and the offline assets it trains with."""
    assets = offline_assets_record(config)
    return {"config": config.to_dict(), **({"offline_assets": assets} if assets is not None else {})}


def _stop_gracefully(run: _Run, stop: StopSignals) -> None:
    """After a stop request: checkpoint what is not yet (unless a learner is in a run of skipped updates), then
    raise :class:`TrainingInterrupted`."""
    if run.completed > (run.checkpointed or 0) and not any(run.streaks.values()):
        _save_training_state(run)
    assert stop.received is not None
    raise TrainingInterrupted(
        stop.received, run.run_dir, run.completed, run.config.iterations, run.checkpointed, at_once=False
    )


def _end_training(run: _Run, stop: StopSignals) -> None:
    """The last checkpoint and the learners' export, then (a signal now stopping at once) the end-of-run
    evaluation; the run is ``finished`` once all is written."""
    config, setup, run_dir = run.config, run.setup, run.run_dir
    if run.checkpointed != run.completed:
        _save_training_state(run)
    stop.graceful = False
    if _stop_requested(run, stop):  # a signal during that save, on any rank
        _stop_gracefully(run, stop)
    # Ranks in lockstep (FSDP models) all join the forwards and gathers: all export and evaluate, rank 0 writes.
    if not run.writes and not setup.placement.lockstep:
        return
    if config.logging.save_checkpoint:
        for learner_id, learner in setup.trained_learners.items():  # a game's fixed opponents have no policy
            learner.save(run_dir / EXPORT_DIR / learner_id)
    if config.logging.eval_queries > 0 and setup.task is not None:  # a game is evaluated by marllm eval
        run.result.eval_rows = evaluate_alone(
            config, setup.task, setup.learners, config.logging.eval_queries, config.seed, setup.placement
        )
        if run.writes:
            write_atomic(run_dir / EVAL_FILE, "".join(json.dumps(row) + "\n" for row in run.result.eval_rows))
    if config.logging.pass_at_k is not None:
        results = evaluate_pass_at_k_alone(
            config,
            setup.learners,
            progress=config.logging.progress and run.writes,
            task=setup.task,
            placement=setup.placement,
        )
        if run.writes:
            write_atomic(run_dir / PASS_AT_K_FILE, json.dumps(results, indent=2))
    if run.writes:
        update_run_info(run_dir, status="finished", completed_iterations=run.completed)


def _record_stop(run: _Run, error: BaseException) -> BaseException:
    """Record why the run stopped in ``run.json`` (or, for a new run with nothing logged, remove what it wrote);
    return the exception to raise. A resume that stopped before it changed anything leaves the run as it was."""
    if not run.writes or not (run.fresh or run.opened):
        pass
    elif run.fresh and run.completed == 0:
        _remove_new_run(run)
    elif (run.run_dir / RUN_FILE).is_file():
        interrupted = isinstance(error, KeyboardInterrupt)
        details = {} if interrupted else {"error": f"{type(error).__name__}: {error}".splitlines()[0]}
        try:
            update_run_info(
                run.run_dir,
                status="interrupted" if interrupted else "failed",
                completed_iterations=run.completed,
                **details,
            )
        except OSError as unwritten:  # a full disk, say: the error that stopped the run is the one to raise
            error.add_note(f"{run.run_dir / RUN_FILE} could not record it: {unwritten}")
    if isinstance(error, TrainingInterrupted) and error.run_dir is None:  # raised by a signal handler
        return TrainingInterrupted(
            error.signal_number, run.run_dir, run.completed, run.config.iterations, run.checkpointed, at_once=True
        )
    return error


def _remove_new_run(run: _Run) -> None:
    """Remove what a new run wrote: the directories it created, or else its files."""
    if run.created is not None:
        shutil.rmtree(run.created, ignore_errors=True)
    elif run.run_dir.is_dir():
        remove_run_files(run.run_dir, keep=run.preexisting)
