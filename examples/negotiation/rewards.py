"""The negotiation's rewards: the seller wants a high price, the buyer a low one.

The deal is the last price named in the dialogue (the first number of the latest turn that names one). Each role's
reward is its share of the deal measured against the list price, so the two are opposed: at the list price both get
0, every dollar below it is the buyer's gain and the seller's loss. A dialogue in which nobody names a price is no
deal, which costs both -1.

``haggle`` is one role-aware reward (a parameter named ``context`` says whose turn it scores); ``seller`` and
``buyer`` are the same rule as one reward per role, for ``task.reward: {seller: ..., buyer: ...}``.
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"\d+(?:\.\d+)?")


def first_price(text: str) -> float | None:
    """The first number of ``text`` (the prompts end in ``$``, so an offer starts with it), or None."""
    match = NUMBER.search(text.replace(",", ""))
    return float(match.group()) if match else None


def deal(dialogue: list[str]) -> float | None:
    """The last price named in one dialogue's responses (oldest first), or None when nobody named one."""
    for text in reversed(dialogue):
        price = first_price(text)
        if price is not None:
            return price
    return None


def role_rewards(role: str, samples, dialogue) -> list[float]:
    """Each dialogue's reward for ``role``: the price against the list price, within [-1, 1], positive above it for
    the seller and below it for the buyer; no deal is -1 for both. ``dialogue``: every turn's responses."""
    rewards = []
    for i, sample in enumerate(samples):
        price = deal([turn[i] for turn in dialogue])
        if price is None:
            rewards.append(-1.0)
            continue
        seller_gain = max(-1.0, min(1.0, price / float(sample["list_price"]) - 1.0))
        rewards.append(seller_gain if role == "seller" else -seller_gain)
    return rewards


def haggle(samples, responses, context):
    """One reward for both roles: ``context.role`` says whose turn is scored, ``context.dialogue`` holds the deal."""
    return role_rewards(context.role, samples, context.dialogue)


def seller(samples, responses, context):
    """The seller's reward alone (for a reward per role)."""
    return role_rewards("seller", samples, context.dialogue)


def buyer(samples, responses, context):
    """The buyer's reward alone (for a reward per role)."""
    return role_rewards("buyer", samples, context.dialogue)
