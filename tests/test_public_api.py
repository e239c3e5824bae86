"""The public names a newcomer reaches for, and the Python examples and commands of the README and docs pages."""

import contextlib
import importlib
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import marllm
from tests.test_probe_findings import load_lambda_trend

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

PUBLIC = {
    "marllm": [
        "SequentialTextEnv",
        "SharedReward",
        "RolePermutation",
        "PPOLearner",
        "PPOConfig",
        "GenerationConfig",
        "make_learners",
        "ModelPlacement",
        "AlgorithmOptions",
        "run_iteration",
        "train",
        "TrainConfig",
        "load_config",
        "ConfigError",
        "RewardFunctionError",
    ],
    "marllm.envs": ["SequentialTextEnv", "env", "raw_env", "TextBatch", "RewardFn", "RewardFunctionError"],
    "marllm.wrappers": ["SharedReward", "RolePermutation", "cooperation_matrix", "check_coefficients"],
    "marllm.algorithms": [
        "PPOLearner",
        "PPOConfig",
        "GenerationConfig",
        "AdaptiveKLController",
        "FixedKLController",
        "AlgorithmOptions",
    ],
}


@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_every_public_name_imports_and_is_listed(module_name):
    module = importlib.import_module(module_name)
    for name in PUBLIC[module_name]:
        assert getattr(module, name) is not None, name
        assert name in module.__all__, name
    for name in module.__all__:
        getattr(module, name)  # nothing listed that does not exist


def test_top_level_names_are_the_defining_objects():
    from marllm.algorithms.catalog import AlgorithmOptions
    from marllm.algorithms.ppo import PPOLearner
    from marllm.envs.text_env import SequentialTextEnv
    from marllm.models.placement import ModelPlacement
    from marllm.run.learners import make_learners
    from marllm.wrappers.role_permutation import RolePermutation

    assert marllm.PPOLearner is PPOLearner and marllm.SequentialTextEnv is SequentialTextEnv
    assert marllm.make_learners is make_learners and marllm.RolePermutation is RolePermutation
    assert marllm.ModelPlacement is ModelPlacement and marllm.AlgorithmOptions is AlgorithmOptions
    assert marllm.algorithms.AlgorithmOptions is AlgorithmOptions
    assert marllm.envs.raw_env is SequentialTextEnv
    with pytest.raises(AttributeError, match="no attribute 'PPOTrainer'"):
        marllm.PPOTrainer  # noqa: B018


def test_importing_marllm_loads_no_torch():
    code = "import sys, marllm; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def documented_pages() -> list[Path]:
    """The README and every page of the documentation site (docs/), in a stable order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def page_name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def python_blocks() -> list[tuple[Path, str]]:
    """Every ```python block of the README and the docs pages, with its page: each one runs as written."""
    blocks = [
        (page, code)
        for page in documented_pages()
        for code in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.DOTALL)
    ]
    assert any(page == README for page, _ in blocks), "the README has no Python example"
    return blocks


def block_ids(blocks: list[tuple[Path, str]]) -> list[str]:
    """``README.md#1``, ``docs/guides/usage.md#2``: the page and the block's number on it, from 1."""
    ids, counts = [], {}
    for page, _ in blocks:
        counts[page] = counts.get(page, 0) + 1
        ids.append(f"{page_name(page)}#{counts[page]}")
    return ids


def run_block(code: str, page: Path, tiny_lm_dir: Path) -> str:
    """Run a documented block as written, with the tiny local GPT-2 standing in for the embedded base model."""
    code = code.replace('"marllm:offline-base"', repr(str(tiny_lm_dir)))
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(code, str(page), "exec"), {"__name__": "documented_example"})
    return output.getvalue()


@pytest.mark.parametrize(("page", "code"), python_blocks(), ids=block_ids(python_blocks()))
def test_documented_python_example_runs_and_is_deterministic(page, code, tiny_lm_dir, monkeypatch):
    monkeypatch.chdir(ROOT)  # examples name files relative to the repository root, as the commands do
    first = run_block(code, page, tiny_lm_dir)
    second = run_block(code, page, tiny_lm_dir)
    assert first.strip(), "the example prints what it computed"
    assert first == second, f"two runs of the example of {page_name(page)} with the same seed differ"


def test_lazy_exports_and_all_agree():
    assert sorted(marllm._EXPORTS) == sorted(set(marllm.__all__) - {"__version__"})


def bash_lines(*command: str) -> list[tuple[Path, list[str]]]:
    """Every line of the bash blocks of the README and the docs pages that starts with the words ``command``, with
    its page and the words after them; continuations joined, comments dropped."""
    lines = []
    for page in documented_pages():
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.DOTALL):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if tuple(words[: len(command)]) == command:
                    lines.append((page, words[len(command) :]))
    return lines


def cli_commands() -> list[tuple[Path, list[str]]]:
    """Every ``.venv/bin/marllm ...`` line of the bash blocks of the README and the docs pages, with its page."""
    commands = bash_lines(".venv/bin/marllm")
    assert any(page == README for page, _ in commands), "the README shows no marllm command"
    return commands


@pytest.mark.parametrize(
    ("page", "argv"), cli_commands(), ids=[f"{page_name(page)}: {' '.join(argv[:2])}" for page, argv in cli_commands()]
)
def test_documented_commands_parse_and_name_files_that_exist(page, argv):
    from marllm.cli import _parse

    args = _parse(argv)  # exits (SystemExit) on an unknown option or a missing argument, as `marllm` does
    assert callable(args.handler)
    for word in argv:
        if word.startswith("examples/"):
            assert (ROOT / word).is_file(), f"{page_name(page)} names {word}, which does not exist"


def test_documented_lambda_trend_commands_parse():
    """The λ trend's documented lines parse as its command line reads them (a λ list that starts with a minus
    included)."""
    trend = load_lambda_trend()
    commands = bash_lines(".venv/bin/python", "scripts/lambda_trend.py")
    assert len(commands) >= 5, "the λ results pages show their lambda_trend.py commands"
    for page, argv in commands:
        args = trend.parse_args(argv)
        assert args.study_dir.parts[:2] == ("runs", "studies"), f"{page_name(page)}: {argv}"
    assert trend.parse_args(["runs/studies/x", "--dialogues", "-1,0,1"]).dialogues == [-1.0, 0.0, 1.0]
    with pytest.raises(SystemExit):
        trend.parse_args(["runs/studies/x", "--dialogues", "one"])


def test_readme_links_name_files_that_exist():
    """The README is read outside the docs site, whose build checks its own links: its relative links and images
    must name files of the repository."""
    targets = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    relative = [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    assert relative, "the README links to no page of the docs"
    for target in relative:
        assert (ROOT / target).is_file(), f"the README links to {target}, which does not exist"


def test_importing_the_config_loads_no_torch():
    # The config layer checks names (devices, dtypes, LoRA, tasks) without torch, so that `marllm` commands that only
    # read configs and runs stay light.
    code = "import sys, marllm.config, marllm.studies.spec; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
