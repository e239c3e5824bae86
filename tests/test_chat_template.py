"""Prompts rendered through the tokenizer's chat template (instruct models), and refused without one."""

import copy

import pytest
import torch

from marllm.algorithms import GenerationConfig, PPOConfig, PPOLearner
from marllm.config import config_from_dict
from marllm.config.loading import ConfigError
from marllm.models.generation import encode_prompts
from tests.conftest import make_tiny_gpt2

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture
def chat_tokenizer(tokenizer):
    chat = copy.deepcopy(tokenizer)
    chat.chat_template = TEMPLATE
    return chat


def test_prompts_become_user_turns_ending_in_the_generation_prompt(chat_tokenizer):
    encoded = encode_prompts(chat_tokenizer, ["a good film", "bad"], chat_template=True)
    for row, prompt in enumerate(["a good film", "bad"]):
        expected = chat_tokenizer(f"<user> {prompt}\n<assistant>", add_special_tokens=False)["input_ids"]
        ids = encoded["input_ids"][row][encoded["attention_mask"][row].bool()].tolist()
        assert ids == expected
    plain = encode_prompts(chat_tokenizer, ["a good film"], chat_template=False)
    assert plain["input_ids"][0].tolist() == chat_tokenizer("a good film")["input_ids"]


def test_a_learner_generates_and_trains_on_the_rendered_prompt(chat_tokenizer):
    model = make_tiny_gpt2(chat_tokenizer)
    reference = make_tiny_gpt2(chat_tokenizer).requires_grad_(False).eval()
    generation = GenerationConfig(4, 6, chat_template=True)
    learner = PPOLearner(
        "llm1",
        model=model,
        tokenizer=chat_tokenizer,
        reference=reference,
        config=PPOConfig.from_flat(mini_batch_size=4),
        generation=generation,
        seed=0,
    )
    learner.act({"prompt": ["this movie was"] * 4})
    rollout = learner.rollouts[0]
    rendered = chat_tokenizer("<user> this movie was\n<assistant>", add_special_tokens=False)["input_ids"]
    assert rollout.tensors.input_ids[0, : rollout.prompt_length].tolist() == rendered
    learner.finish([1.0, 0.0, 1.0, 0.0])
    before = [p.clone() for p in model.parameters()]
    learner.update()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_chat_template_without_a_template_is_refused_when_the_learner_is_built(tokenizer):
    model = make_tiny_gpt2(tokenizer)
    with pytest.raises(ValueError, match="generation.chat_template is true but the tokenizer .* has no chat template"):
        PPOLearner(
            "llm1",
            model=model,
            tokenizer=tokenizer,
            reference=model,
            config=PPOConfig.from_flat(mini_batch_size=4),
            generation=GenerationConfig(chat_template=True),
        )


def test_chat_template_setting_is_a_bool():
    with pytest.raises(ConfigError, match="generation.chat_template must be true or false"):
        config_from_dict({"generation": {"chat_template": "yes"}})
