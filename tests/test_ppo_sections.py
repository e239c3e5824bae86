"""The ``ppo`` settings in sections: a key written outside its section is answered with its place (in YAML and as an
override), :meth:`PPOConfig.from_flat` places keywords by their names, and each section's checks name its dotted
keys."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from marllm.algorithms.ppo_config import (
    PPO_SETTING_PLACES,
    BatchingConfig,
    ComputeConfig,
    GuardsConfig,
    KLConfig,
    OptimiserConfig,
    PPOConfig,
)
from marllm.config import ConfigError, config_from_dict, load_config

ROOT = Path(__file__).resolve().parents[1]
CORY = ROOT / "examples" / "cory_offline.yaml"
SECTIONS = {
    "optimiser": OptimiserConfig,
    "batching": BatchingConfig,
    "kl": KLConfig,
    "compute": ComputeConfig,
    "guards": GuardsConfig,
}


def test_the_table_places_every_field_of_every_section_and_nothing_else():
    placed = {(section, key) for section, key in (new.split(".") for new in PPO_SETTING_PLACES.values())}
    fields = {(name, f.name) for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    assert placed == fields and all(new.endswith(f".{old}") for old, new in PPO_SETTING_PLACES.items())
    own = {f.name for f in dataclasses.fields(PPOConfig)}
    assert own == set(SECTIONS) | {
        "gamma", "lam", "clip_range", "clip_range_value", "vf_coef", "whiten_advantages", "score_transform",
        "score_clip",
    }  # fmt: skip
    assert not own & PPO_SETTING_PLACES.keys()


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("learning_rate", "optimiser.learning_rate"),
        ("mini_batch_size", "batching.mini_batch_size"),
        ("init_kl_coef", "kl.init_kl_coef"),
        ("micro_batch_size", "compute.micro_batch_size"),
        ("on_nonfinite", "guards.on_nonfinite"),
    ],
)
def test_a_key_outside_its_section_is_answered_with_its_place(tmp_path, old, new):
    refusal = rf"unknown config key 'ppo.{old}' \('{old}' is 'ppo.{new}': write it there\)"
    with pytest.raises(ConfigError, match=refusal):
        load_config(CORY, [f"ppo.{old}=1"])
    path = tmp_path / "flat.yaml"
    path.write_text(f"ppo:\n  gamma: 1.0\n  {old}: 1\n")
    with pytest.raises(ConfigError, match=refusal):
        load_config(path)
    with pytest.raises(ConfigError, match=refusal):
        config_from_dict({"ppo": {old: 1}})


def test_from_flat_places_the_flat_settings_in_their_sections():
    made = PPOConfig.from_flat(
        mini_batch_size=4, learning_rate=1e-3, kl_control="fixed", gamma=0.9, fused_kernels=False
    )
    assert made == PPOConfig(
        gamma=0.9,
        optimiser=OptimiserConfig(learning_rate=1e-3),
        batching=BatchingConfig(mini_batch_size=4),
        kl=KLConfig(kl_control="fixed"),
        compute=ComputeConfig(fused_kernels=False),
    )
    assert PPOConfig.from_flat() == PPOConfig()
    # a whole section and a flat key of it: the key is set in the section given
    merged = PPOConfig.from_flat(batching=BatchingConfig(ppo_epochs=1), mini_batch_size=2)
    assert merged.batching == BatchingConfig(ppo_epochs=1, mini_batch_size=2)
    with pytest.raises(TypeError, match=r"unknown setting\(s\) \['lr'\]; valid ones: \['adam_eps', 'anneal_updates'"):
        PPOConfig.from_flat(lr=1e-3)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"learning_rate": 0.0}, "ppo.optimiser.learning_rate must be a finite number > 0, got 0.0"),
        ({"anneal_updates": 0}, "ppo.optimiser.anneal_updates must be a finite number > 0, got 0"),
        ({"mini_batch_size": 0}, "ppo.batching.mini_batch_size must be a finite number > 0, got 0"),
        ({"last_minibatch": "drop"}, r"ppo.batching.last_minibatch must be one of \['whole', 'merge'\]"),
        ({"kl_penalty": "k3"}, r"ppo.kl.kl_penalty must be one of \['k1', 'full'\]"),
        ({"target_kl": 0.0}, "ppo.kl.target_kl must be a finite number > 0, got 0.0"),
        ({"micro_batch_size": 0}, "ppo.compute.micro_batch_size must be a finite number > 0, got 0"),
        ({"autocast_dtype": "float16"}, "ppo.compute.autocast_dtype must be 'bfloat16' or null"),
        ({"ratio_threshold": 1.0}, "ppo.guards.ratio_threshold must be a number > 1 or null"),
        ({"max_consecutive_skips": -1}, "ppo.guards.max_consecutive_skips must be an integer >= 0, got -1"),
    ],
)
def test_each_section_checks_its_settings_naming_their_dotted_keys(settings, message):
    with pytest.raises(ValueError, match=message):
        PPOConfig.from_flat(**settings)
    section, key = PPO_SETTING_PLACES[next(iter(settings))].split(".")
    with pytest.raises(ConfigError, match=rf"ppo\.{section}\.{key} must be"):  # the loader may name the type first
        config_from_dict({"ppo": {section: {key: settings[key]}}})


def test_a_section_given_as_something_else_is_refused():
    with pytest.raises(TypeError, match="ppo.batching must be a BatchingConfig"):
        PPOConfig(batching={"mini_batch_size": 4})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ppo.batching must be a mapping, got int 4"):
        config_from_dict({"ppo": {"batching": 4}})
