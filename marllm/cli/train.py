"""``marllm train``: one run from a config, its data-parallel launch, and what to say when it stops."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from marllm.config import load_config
from marllm.config.loading import ConfigError
from marllm.run.interrupts import TrainingInterrupted
from marllm.run.run_dir import DirectoryInUseError, WrongDirectoryError, read_run_info
from marllm.studies.files import EXPANSION_FILE, STUDY_FILE


def train_command(args: argparse.Namespace) -> int:
    """``marllm train CONFIG``: train (or resume) a run; with ``--nproc N``, launch it on N data-parallel ranks."""
    from marllm.parallel import distributed, launcher  # torch: kept out of `marllm --help`

    config = load_config(args.config, args.overrides)
    run_dir = _train_run_dir(args) or config.resolved_run_dir()
    _refuse_study_dir(run_dir)
    if args.nproc > 1:
        config.check_placement(args.nproc)
        return launcher.launch_ranks(args.nproc, _train_arguments(args))
    # Training's modules (seconds to import): kept out of `marllm --help` and of the launcher of --nproc's ranks.
    from marllm.run.train import train
    world_size = distributed.launched_world_size()
    ranks = ["--nproc", str(world_size)] if world_size > 1 else []
    resume_command = shlex.join(["marllm", "train", args.config, *args.overrides, *ranks, "--resume", str(run_dir)])
    try:
        result = train(config, run_dir, resume=args.resume is not None, overwrite=args.overwrite)
    except TrainingInterrupted as stop:
        if distributed.launched_rank() == 0:  # the only process, or rank 0 of the run
            print(f"marllm: {stop.summary()}; {_next_step(stop, resume_command, args)}", file=sys.stderr)
        return stop.exit_status
    except Exception as error:
        _add_resume_note(error, run_dir, resume_command)
        raise
    if distributed.launched_rank() == 0:
        print(f"run written to {result.run_dir}")
    return 0


def _train_arguments(args: argparse.Namespace) -> list[str]:
    """The arguments of ``marllm train`` that each rank of ``--nproc`` runs with (everything but ``--nproc``)."""
    arguments = [args.config, *args.overrides]
    if args.run_dir is not None:
        arguments += ["--run-dir", args.run_dir]
    if args.resume is not None:
        arguments += ["--resume"] if args.resume is True else ["--resume", args.resume]
    if args.overwrite:
        arguments.append("--overwrite")
    return arguments


def _train_run_dir(args: argparse.Namespace) -> Path | None:
    """The run directory of ``marllm train``: ``--resume RUN_DIR`` or ``--run-dir`` (None: the config's)."""
    if isinstance(args.resume, str):
        if args.run_dir is not None and Path(args.run_dir) != Path(args.resume):
            raise ConfigError(f"--resume {args.resume} and --run-dir {args.run_dir} name different run directories")
        return Path(args.resume)
    return Path(args.run_dir) if args.run_dir is not None else None


def _refuse_study_dir(run_dir: Path) -> None:
    """Refuse to train into a study directory (one holding ``study.yaml`` or ``study.json``): its runs live in its
    ``runs/`` and ``marllm study`` trains them.

    Raises:
        WrongDirectoryError: naming the study file found and what to give instead.
    """
    found = [name for name in (STUDY_FILE, EXPANSION_FILE) if (run_dir / name).is_file()]
    if found:
        raise WrongDirectoryError(
            f"run directory {run_dir} is a study directory (it holds {' and '.join(found)}): marllm study trains its "
            f"runs, in {run_dir / 'runs'}/NAME; train into a run directory of its own (--run-dir)"
        )


def _next_step(stop: TrainingInterrupted, resume_command: str, args: argparse.Namespace) -> str:
    """How to go on after an interrupted run: resume it, or (nothing to resume) start it again."""
    if stop.resumable:
        return f"resume with: {resume_command}"
    if stop.completed == 0 and args.resume is None:
        return "nothing was kept"
    return "start it again with --overwrite"


def _add_resume_note(error: Exception, run_dir: Path, resume_command: str) -> None:
    """After a failure, say which checkpoint of the run stays and how to resume from it."""
    if isinstance(error, ConfigError | DirectoryInUseError):
        return
    info = read_run_info(run_dir) if run_dir.is_dir() else {}
    if info.get("status") != "failed" or info.get("checkpoint_iteration") is None:
        return
    hint = " ppo.guards.on_nonfinite=skip" if isinstance(error, FloatingPointError) else ""
    error.add_note(
        f"the run's latest checkpoint (iteration {info['checkpoint_iteration']}) stays; resume with: "
        f"{resume_command}{hint}"
    )
