"""Data-parallel training (marllm.parallel.distributed): two gloo ranks update as one process does (PPO and the
critic-free learners, in free text and in a game's action modes); tests/test_data_parallel_cli.py trains end to end."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from marllm.algorithms.ppo import PPOLearner
from marllm.config import load_config
from marllm.config.loading import ConfigError
from marllm.envs.text_env import SequentialTextEnv
from marllm.testing import run_ranks
from tests.conftest import make_tiny_gpt2
from tests.data_parallel_cases import (
    CASES,
    LEGAL_MOVES,
    PPO,
    RATIO_SKIPS,
    SHARDED_CASES,
    build_learner,
    generated,
    on_rank,
    state_after_update,
)
from tests.test_ppo_learner import make_learner

ROOT = Path(__file__).resolve().parents[1]
ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PATH": "/usr/bin:/bin"}


TURN_PROMPTS = (
    ("this movie was", "the story is", "i hated the", "what a"),
    ("the actors in this movie were", "i think the story", "a film that", "what a long and slow"),
)


def rewarded_rollout(case: str, tokenizer) -> object:
    """A global batch of BATCH responses (groups of 2 prompts) from the case's learner, with rewards; for a case
    of several turns, a list of one such rollout per turn (each turn's prompts of other lengths)."""
    learner = build_learner(case, tokenizer)
    turns = CASES[case].get("turns", 1)
    target = tokenizer.encode(" good")[0]
    torch.manual_seed(1)
    for turn in range(turns):
        prompts = [p for p in TURN_PROMPTS[turn] for _ in range(2)]
        moves = {"legal_moves": [m for m in LEGAL_MOVES for _ in range(2)]} if "actions" in CASES[case] else {}
        learner.act({"prompt": prompts, **moves})
        ids = [tokenizer.encode(r) for r in learner.rollouts[turn].responses]
        learner.finish([sum(t == target for t in row) / max(len(row), 1) + 0.1 * i for i, row in enumerate(ids)])
    return learner.rollouts[0] if turns == 1 else list(learner.rollouts)


@pytest.fixture(scope="module")
def one_and_two_ranks(tmp_path_factory, tokenizer):
    """Per case: the state after one update on one process, and on each of two ranks, from the same rollout."""
    directory = tmp_path_factory.mktemp("data_parallel")
    rollouts = {case: rewarded_rollout(case, tokenizer) for case in CASES}
    torch.save(rollouts, directory / "rollouts.pt")
    run_ranks(on_rank, directory, timeout=300)
    single = {case: state_after_update(build_learner(case, tokenizer), copy.deepcopy(rollouts[case])) for case in CASES}
    ranks = [{**torch.load(directory / f"rank{r}.pt", weights_only=False), "out_dir": directory} for r in range(2)]
    return single, ranks


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_update_as_one_process_does(one_and_two_ranks, case, tokenizer):
    single, ranks = one_and_two_ranks
    assert_same_step_gradients(single[case], ranks[0][case], ranks[1][case])
    start = [p.detach() for p in build_learner(case, tokenizer)._trained_parameters()]
    after_update = single[case]["parameters"]
    moved = max((after - before).abs().max().item() for after, before in zip(after_update, start, strict=True))
    assert moved > 1e-3  # the update changed the parameters far beyond the tolerance below
    # An element whose gradient is zero up to rounding at every step (|g| < 1e-9: a scored move leaves some weights
    # unused) takes Adam steps of lr·g/ε, its rounding noise amplified: the gradients above already compare it.
    flat_gradients = torch.stack(single[case]["gradients"]).abs().amax(0)
    assert flat_gradients.numel() == sum(p.numel() for p in single[case]["parameters"])  # every parameter's, in order
    offset = 0
    for after_one, after_rank0, after_rank1 in zip(
        single[case]["parameters"], ranks[0][case]["parameters"], ranks[1][case]["parameters"], strict=True
    ):
        # The ranks stay in step: after the same summed gradients they take the same step (20× tighter than below).
        torch.testing.assert_close(after_rank0, after_rank1, rtol=1e-5, atol=1e-6)
        used = flat_gradients[offset : offset + after_one.numel()].reshape(after_one.shape) >= 1e-9
        offset += after_one.numel()
        # Float sums in another order (gradients over two ranks, moments in float64) differ in the last bits only.
        torch.testing.assert_close(after_rank0[used], after_one[used], rtol=1e-4, atol=2e-5)
    for key in ("kl_coef", "score_mean", "score_var"):
        assert ranks[0][case][key] == pytest.approx(single[case][key], rel=1e-5, abs=1e-7), key
    # Batch means over the ranks' equal slices are the global batch's.
    for key in ("task_reward", "received_reward", "kl", "kl_penalty", "response_length"):
        assert ranks[0][case]["metrics"][key] == pytest.approx(single[case]["metrics"][key], rel=1e-5), key
        assert ranks[1][case]["metrics"][key] == ranks[0][case]["metrics"][key]


LOSS_METRICS = ("loss/policy", "loss/value", "loss/total", "clipfrac", "value_clipfrac", "approx_kl", "ratio")


def test_micro_batched_ranks_report_the_loss_metrics_of_whole_mini_batches(one_and_two_ranks):
    """Passes of one row report what whole mini-batches report, on one process and on two ranks (each rank's means
    of its own rows, averaged over the ranks), not that divided by the number of ranks."""
    single, ranks = one_and_two_ranks
    for key in LOSS_METRICS:
        # A clip fraction counts tokens on either side of a bound: a rounding may move one of the ~200 across it.
        tolerance = {"abs": 0.02} if key.endswith("clipfrac") else {"rel": 1e-4, "abs": 1e-6}
        for states in (single, *ranks):
            whole, micro = states["ppo_whole_batches"]["metrics"][key], states["ppo_micro_batches"]["metrics"][key]
            assert micro == pytest.approx(whole, **tolerance), key
    assert abs(single["ppo_micro_batches"]["metrics"]["loss/policy"]) > 1e-3  # a loss large enough to tell


def test_a_nonfinite_pass_on_one_rank_skips_the_step_on_both(one_and_two_ranks):
    """Rank 1's first pass is NaN while rank 0's are finite: both ranks report the skip (no hang: the torchrun of
    the fixture has a timeout) and neither moved its weights."""
    _, ranks = one_and_two_ranks
    for rank in ranks:
        found = rank["micro/nonfinite"]
        assert found["metrics"]["nonfinite_skipped"] == 1.0
        assert "non-finite PPO loss" in found["last_nonfinite"]
        for before, after in zip(found["before"], found["parameters"], strict=True):
            torch.testing.assert_close(after, before, rtol=0, atol=0, equal_nan=True)
    assert "another rank" in ranks[0]["micro/nonfinite"]["last_nonfinite"]


def assert_same_step_gradients(one, rank0, rank1):
    """Each optimiser step of the two ranks was handed one process's gradient: the same on both ranks, and one
    process's within 1e-4 of its largest component. Float sums in another order move it by ~1e-6 of that; a
    gradient scaled by the ranks' sum (halved, doubled, or off by 10%) moves it by that share of it at every step,
    while Adam's steps, which divide the gradient by its own magnitude, show the scale in the parameters only
    through ε: on the few components whose gradient is near ε."""
    steps = one["gradients"]
    assert len(steps) == len(rank0["gradients"]) == len(rank1["gradients"]) > 0
    for expected, on_rank0, on_rank1 in zip(steps, rank0["gradients"], rank1["gradients"], strict=True):
        scale = expected.abs().max().item()
        assert scale > 0
        assert (on_rank0 - on_rank1).abs().max() <= 1e-6 * scale
        assert (on_rank0 - expected).abs().max() <= 1e-4 * scale


@pytest.mark.parametrize("case", SHARDED_CASES)
def test_sharded_ranks_update_checkpoint_and_export_as_one_process_does(
    one_and_two_ranks, case, tmp_path_factory, tokenizer
):
    single, ranks = one_and_two_ranks
    sharded = [ranks[r][f"fsdp/{case}"] for r in range(2)]
    assert_same_step_gradients(single[case], *sharded)
    for after_one, after_rank0, after_rank1 in zip(
        single[case]["parameters"], sharded[0]["parameters"], sharded[1]["parameters"], strict=True
    ):
        torch.testing.assert_close(after_rank0, after_rank1, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(after_rank0, after_one, rtol=1e-4, atol=2e-5)
    # Each rank holds its shard of the policy, value head and reference, not a whole copy.
    whole = sum(p.numel() for p in after_update_and_reference(single, case))
    assert sharded[0]["elements_held"] + sharded[1]["elements_held"] == whole
    assert max(sharded[0]["elements_held"], sharded[1]["elements_held"]) < 0.6 * whole
    for key in ("task_reward", "kl", "response_length"):
        assert sharded[0]["metrics"][key] == pytest.approx(single[case]["metrics"][key], rel=1e-5), key
    # The checkpoint state is gathered whole (policy, value head, Adam's moments) under the unsharded names, and
    # restores into fresh sharded learners as it was.
    state, expected = sharded[0]["state"], single[case]["state"]
    assert state.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(state[name], expected[name], rtol=1e-4, atol=2e-5, msg=name)
        # Sliced into shards and gathered again: data moved, no arithmetic, so the bits are the same on any CPU.
        torch.testing.assert_close(sharded[0]["restored"][name], state[name], rtol=0, atol=0, msg=name)
    # The export is a whole Hugging Face model under its own class name, written once.
    export = Path(ranks[0]["out_dir"]) / f"export-{case}"
    assert json.loads((export / "policy" / "config.json").read_text())["architectures"] == ["GPT2LMHeadModel"]
    # Tied weights (GPT-2's LM head is its token embedding) stay one tensor, saved once as an unsharded model saves it.
    unsharded = tmp_path_factory.mktemp("unsharded")
    make_tiny_gpt2(tokenizer, seed=0).save_pretrained(unsharded)
    assert safetensor_names(export / "policy") == safetensor_names(unsharded)
    exported = AutoModelForCausalLM.from_pretrained(export / "policy")
    for name, parameter in exported.named_parameters():
        torch.testing.assert_close(parameter, state[f"policy/{name}"], rtol=0, atol=0, msg=name)


def test_sharded_models_compute_in_bfloat16_and_train_float32_shards(one_and_two_ranks, tokenizer):
    single, ranks = one_and_two_ranks
    start = [p.detach() for p in build_learner("ppo", tokenizer)._trained_parameters()]
    steps = {}
    for name, parameters in (("one process", single["ppo"]["parameters"]),
                             ("bfloat16", ranks[0]["fsdp/bfloat16"]["parameters"])):
        assert {p.dtype for p in parameters} == {torch.float32}
        steps[name] = torch.cat([(after - before).flatten() for after, before in zip(parameters, start, strict=True)])
    assert ranks[0]["fsdp/bfloat16"]["computed_in"] == {torch.bfloat16}
    rank0, rank1 = (rank["fsdp/bfloat16"]["parameters"] for rank in ranks)
    for after_rank0, after_rank1 in zip(rank0, rank1, strict=True):
        torch.testing.assert_close(after_rank0, after_rank1, rtol=1e-5, atol=1e-6)
    # bfloat16 forwards change every step a little (8 bits of mantissa) but not where the update goes.
    similarity = torch.nn.functional.cosine_similarity(steps["one process"], steps["bfloat16"], dim=0)
    print(f"cosine similarity of the float32 and bfloat16-compute updates: {similarity:.4f}")
    assert similarity > 0.9


def test_sharded_models_generate_what_the_whole_model_generates(one_and_two_ranks, tokenizer):
    _, ranks = one_and_two_ranks
    whole = make_tiny_gpt2(tokenizer, seed=0)
    for rank, results in enumerate(ranks):
        found = results["fsdp/generation"]
        # The same seed and prompts give the same responses as the whole model: gathered once for the call, or
        # gathered layer by layer at every token, while the other rank generates for other prompts.
        assert found["gathered=True"] == found["gathered=False"] == generated(whole, tokenizer, rank)
        assert found["sharded_after/gathered=True"] and found["sharded_after/gathered=False"]
    assert ranks[0]["fsdp/generation"]["gathered=True"] != ranks[1]["fsdp/generation"]["gathered=True"]


def test_sharded_ranks_agree_to_skip(one_and_two_ranks, tokenizer):
    _, ranks = one_and_two_ranks
    single = make_learner(tokenizer, 0, PPOLearner, None, **{**PPO, **RATIO_SKIPS})
    rollout = torch.load(Path(ranks[0]["out_dir"]) / "rollouts.pt", weights_only=False)["ppo"]
    expected = state_after_update(single, rollout)
    assert 0 < expected["metrics"]["skipped_minibatch_fraction"] < 1  # the threshold skips some, not all
    for rank in ranks:
        ratio, nonfinite = rank["fsdp/agreement"]["ratio"], rank["fsdp/agreement"]["nonfinite"]
        # The mini-batches over the threshold give no gradient on either rank (they ran forwards only): the steps
        # are one process's.
        for after, after_one in zip(ratio["parameters"], expected["parameters"], strict=True):
            torch.testing.assert_close(after, after_one, rtol=1e-4, atol=2e-5)
        # Rank 1's NaN weight reaches both ranks' losses: the step is dropped on both, after the backward FSDP needs.
        assert nonfinite["metrics"]["nonfinite_skipped"] == 1.0
        assert "non-finite PPO loss" in nonfinite["last_nonfinite"]
        for before, after in zip(nonfinite["before"], nonfinite["parameters"], strict=True):
            torch.testing.assert_close(after, before, rtol=0, atol=0, equal_nan=True)


def safetensor_names(directory):
    """The tensor names of a saved model's safetensors files."""
    names = set()
    for file in Path(directory).glob("*.safetensors"):
        with safe_open(str(file), "pt") as weights:
            names.update(weights.keys())
    return names


def after_update_and_reference(single, case):
    """The one-process learner's trained parameters and its reference's (a copy of the policy's)."""
    policy = [p for name, p in single[case]["state"].items() if name.startswith("policy/")]
    return [*single[case]["parameters"], *policy]


def test_fsdp_config_is_checked_before_anything_starts():
    config = load_config(ROOT / "examples" / "cory_gsm8k_fsdp.yaml")
    config.check_placement(8)
    with pytest.raises(ConfigError, match="model.fsdp shards the models over the processes"):
        config.check_placement(1)
    with pytest.raises(ConfigError, match="model.fsdp shards full models"):
        load_config(ROOT / "examples" / "cory_gsm8k.yaml", ["model.fsdp=true"])
    with pytest.raises(ConfigError, match="model.fsdp_compute_dtype applies to sharded models"):
        load_config(ROOT / "examples" / "cory_gsm8k_fsdp.yaml", ["model.fsdp=false"])
    with pytest.raises(ConfigError, match="model.fsdp_gather_for_generation applies to sharded models"):
        load_config(ROOT / "examples" / "cory_gsm8k.yaml", ["model.fsdp_gather_for_generation=false"])
    with pytest.raises(ConfigError, match="model.fsdp_compute_dtype: model dtype must be one of"):
        load_config(ROOT / "examples" / "cory_gsm8k_fsdp.yaml", ["model.fsdp_compute_dtype=float8"])
    # The sharded example is the LoRA one trained on full float32 weights: nothing else changes.
    sharded, lora = config.to_dict(), load_config(ROOT / "examples" / "cory_gsm8k.yaml").to_dict()
    assert sharded["model"] == {
        **lora["model"], "dtype": "float32", "fsdp": True, "fsdp_compute_dtype": "bfloat16", "lora": None,
        "load_in_4bit": False,
    }
    for data in (sharded, lora):
        del data["name"], data["model"], data["ppo"]["optimiser"]["learning_rate"]
    assert sharded == lora


def test_sharded_envs_play_disjoint_slices_of_one_envs_batches():
    rows = [{"query": f"q{i}"} for i in range(10)]

    def make(shard=(0, 1)):
        return SequentialTextEnv(rows, ["a"], ["{query}"], lambda s, r: [0.0] * len(r), 4, seed=3, group_size=2,
                                 shard=shard)

    whole, halves = make(), [make((0, 2)), make((1, 2))]
    for _ in range(4):  # more batches than a pass over the data: the passes are reshuffled alike
        whole.reset()
        for half in halves:
            half.reset()
        assert halves[0].queries + halves[1].queries == whole.queries
        assert len(halves[0].queries) == halves[0].batch_size == 2
    with pytest.raises(ValueError, match="multiple of 4 × 2 = 8"):
        make((0, 4))
    with pytest.raises(ValueError, match="0 <= index < count"):
        make((2, 2))
