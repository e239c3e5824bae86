"""The public names a newcomer reaches for, and the README's Python examples run as written."""

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

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

PUBLIC = {
    "marllm": [
        "SequentialTextEnv",
        "SharedReward",
        "RolePermutation",
        "PPOLearner",
        "PPOConfig",
        "GenerationConfig",
        "make_learners",
        "run_iteration",
        "train",
        "TrainConfig",
        "load_config",
        "ConfigError",
        "RewardFunctionError",
    ],
    "marllm.envs": ["SequentialTextEnv", "env", "raw_env", "TextBatch", "RewardFn", "RewardFunctionError"],
    "marllm.wrappers": ["SharedReward", "RolePermutation", "cooperation_matrix", "check_coefficients"],
    "marllm.algorithms": ["PPOLearner", "PPOConfig", "GenerationConfig", "AdaptiveKLController", "FixedKLController"],
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
    from marllm.algorithms.ppo import PPOLearner
    from marllm.envs.text_env import SequentialTextEnv
    from marllm.learner_factory import make_learners
    from marllm.wrappers.role_permutation import RolePermutation

    assert marllm.PPOLearner is PPOLearner and marllm.SequentialTextEnv is SequentialTextEnv
    assert marllm.make_learners is make_learners and marllm.RolePermutation is RolePermutation
    assert marllm.envs.raw_env is SequentialTextEnv
    with pytest.raises(AttributeError, match="no attribute 'PPOTrainer'"):
        marllm.PPOTrainer  # noqa: B018


def test_importing_marllm_loads_no_torch():
    code = "import sys, marllm; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def readme_python_blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks, "the README has no Python example"
    return blocks


def run_block(code: str, tiny_lm_dir: Path) -> str:
    """Run a README block as written, with the tiny local GPT-2 standing in for the embedded base model."""
    code = code.replace('"marllm:offline-base"', repr(str(tiny_lm_dir)))
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(code, str(README), "exec"), {"__name__": "readme_example"})
    return output.getvalue()


@pytest.mark.parametrize("index", range(len(readme_python_blocks())))
def test_readme_python_example_runs_and_is_deterministic(index, tiny_lm_dir):
    code = readme_python_blocks()[index]
    first = run_block(code, tiny_lm_dir)
    second = run_block(code, tiny_lm_dir)
    assert first.strip(), "the example prints what it computed"
    assert first == second, "two runs of the README example with the same seed differ"


def test_lazy_exports_and_all_agree():
    assert sorted(marllm._EXPORTS) == sorted(set(marllm.__all__) - {"__version__"})


def readme_cli_commands() -> list[list[str]]:
    """Every ``.venv/bin/marllm ...`` line of the README's bash blocks, continuations joined, comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == [".venv/bin/marllm"]:
                commands.append(words[1:])
    assert commands, "the README shows no marllm command"
    return commands


@pytest.mark.parametrize("argv", readme_cli_commands(), ids=lambda argv: " ".join(argv[:2]))
def test_readme_commands_parse_and_name_files_that_exist(argv):
    from marllm.cli import _parse

    args = _parse(argv)  # exits (SystemExit) on an unknown option or a missing argument, as `marllm` does
    assert callable(args.handler)
    for word in argv:
        if word.startswith("examples/"):
            assert (ROOT / word).is_file(), f"the README names {word}, which does not exist"
