"""Answers restricted to legal moves: each move's tokens as they follow the prompt, a prefix tree of them per row,
the logits processor that lets ``generate`` sample only their continuations, and the same restriction re-applied to
the logits of any later forward.

A restricted response is a legal move's tokens followed by EOS. At each response position the allowed tokens are the
children of the prefix-tree node reached so far, plus EOS where a whole move ends there (so a move that is a prefix
of another, ``1`` and ``10``, ends only by an explicit EOS). The restriction of a batch is kept compactly as the
allowed token ids per response position, (B, L, K) padded with −1 (:func:`allowed_tokens`); a position whose K
entries are all −1 (after the response's end) is unrestricted. :func:`restrict_logits` sets every other token's
logit to −inf, so the log-probs and entropies of the learner's forwards are those of the distribution sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import LogitsProcessor, PreTrainedTokenizerBase

from marllm.models.token_prompts import TokenPrompts


def render_prompts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], chat_template: bool) -> list[str]:
    """The prompts as the model reads them: the text itself, or the user turn of the chat template ending in its
    generation prompt (as :func:`~marllm.models.generation.encode_prompts` renders them); prompts given as token
    ids (:class:`~marllm.models.token_prompts.TokenPrompts`) are their ids decoded, rendered already."""
    if not chat_template or isinstance(prompts, TokenPrompts):
        return list(prompts)
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]


def move_separator(rendered_prompt: str) -> str:
    """What goes between a prompt and a move's name: a space, unless the prompt ends in whitespace already."""
    return "" if not rendered_prompt or rendered_prompt[-1].isspace() else " "


def move_continuations(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    legal_moves: Sequence[Sequence[str]],
    chat_template: bool = False,
) -> list[list[list[int]]]:
    """Each row's legal moves as token ids, as the tokenizer encodes them after that row's prompt.

    A move's text is :func:`move_separator` + its name. Its tokens are those of ``prompt + text`` after the prompt's
    own tokens, so a tokenizer whose tokens carry a leading space (byte-level BPE, SentencePiece) gets the tokens a
    model would read there; where the joint encoding does not start with the prompt's tokens (a merge across the
    boundary) the text is encoded alone.

    Raises:
        ValueError: a row with no legal move, a move whose text has no token, or two moves of a row with the same
            tokens (naming the row and the moves).
    """
    rendered = render_prompts(tokenizer, prompts, chat_template)
    special = not chat_template  # the template writes its own special tokens
    result = []
    for row, (prompt, names) in enumerate(zip(rendered, legal_moves, strict=True)):
        if not names:
            raise ValueError(
                f"row {row}: no legal move to restrict the answer to (a game's free-text turn, GameView.free_text, "
                "needs a mode that writes free text there: generate, or a collector of one's own such as Deal or no "
                "deal's TalkOrPropose)"
            )
        texts = [move_separator(prompt) + name for name in names]
        prompt_ids = tokenizer(prompt, add_special_tokens=special)["input_ids"]
        joint = tokenizer([prompt + text for text in texts], add_special_tokens=special)["input_ids"]
        alone = tokenizer(texts, add_special_tokens=False)["input_ids"]
        n = len(prompt_ids)
        ids = [list(j[n:]) if list(j[:n]) == list(prompt_ids) else list(a) for j, a in zip(joint, alone, strict=True)]
        for name, tokens in zip(names, ids, strict=True):
            if not tokens:
                raise ValueError(f"row {row}: move {name!r} encodes to no token")
        seen: dict[tuple[int, ...], str] = {}
        for name, tokens in zip(names, ids, strict=True):
            if tuple(tokens) in seen:
                raise ValueError(f"row {row}: moves {seen[tuple(tokens)]!r} and {name!r} encode to the same tokens")
            seen[tuple(tokens)] = name
        result.append(ids)
    return result


@dataclass
class MoveTrie:
    """A prefix tree over one row's legal moves' token ids. Node 0 is the root; ``children[n]`` maps a token to
    the next node and ``ends[n]`` is the index of the move that ends at node n (None if none does)."""

    children: list[dict[int, int]] = field(default_factory=lambda: [{}])
    ends: list[int | None] = field(default_factory=lambda: [None])

    @classmethod
    def of(cls, moves: Sequence[Sequence[int]]) -> MoveTrie:
        """The tree of ``moves`` (each a non-empty list of token ids)."""
        trie = cls()
        for index, tokens in enumerate(moves):
            node = 0
            for token in tokens:
                node = trie.children[node].setdefault(int(token), len(trie.children))
                if node == len(trie.children):
                    trie.children.append({})
                    trie.ends.append(None)
            trie.ends[node] = index
        return trie

    def allowed(self, node: int, eos: int) -> list[int]:
        """The tokens that may follow at ``node``: its children, and EOS where a move ends."""
        tokens = list(self.children[node])
        return tokens + [eos] if self.ends[node] is not None else tokens

    def walk(self, tokens: Sequence[int], eos: int) -> tuple[list[list[int]], int | None]:
        """The allowed tokens before each of ``tokens`` (until the EOS that ends a move, inclusive) and the move
        they complete (None if they leave the tree or stop before a move's EOS)."""
        node, allowed = 0, []
        for token in tokens:
            allowed.append(self.allowed(node, eos))
            if token == eos and self.ends[node] is not None:
                return allowed, self.ends[node]
            if token not in self.children[node]:
                return allowed, None
            node = self.children[node][token]
        return allowed, None


def move_tries(moves: Sequence[Sequence[Sequence[int]]]) -> list[MoveTrie]:
    """One :class:`MoveTrie` per row of :func:`move_continuations`."""
    return [MoveTrie.of(row) for row in moves]


class LegalMovesProcessor(LogitsProcessor):
    """Lets ``generate`` sample only continuations of each row's legal moves, then EOS; −inf for every other token.

    Args:
        tries: one prefix tree per row of the batch.
        prompt_length: P, the width of the left-padded prompts (the response starts at column P).
        eos_token_id: the token that ends a complete move.

    Put it first among the processors, so that top-k/top-p keep tokens of the restricted distribution. A row that
    has ended (its EOS sampled) is left as it is: ``generate`` pads it.
    """

    def __init__(self, tries: Sequence[MoveTrie], prompt_length: int, eos_token_id: int):
        self.tries, self.prompt_length, self.eos = list(tries), prompt_length, eos_token_id

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        responses = input_ids[:, self.prompt_length :].tolist()
        keep = torch.zeros_like(scores, dtype=torch.bool)
        for row, (trie, tokens) in enumerate(zip(self.tries, responses, strict=True)):
            allowed, move = trie.walk([*tokens, -1], self.eos)  # -1: the token about to be drawn
            if move is not None or len(allowed) <= len(tokens):  # ended (EOS drawn) or left the tree
                keep[row] = True
                continue
            keep[row, allowed[-1]] = True
        return scores.masked_fill(~keep, -torch.inf)


def allowed_tokens(
    response: torch.Tensor, tries: Sequence[MoveTrie], eos_token_id: int
) -> tuple[torch.Tensor, list[int]]:
    """The restriction each response token was sampled under, and the move each response names: (B, L) response ->
    (B, L, K) allowed token ids, padded with −1 (all −1 after a row's final EOS: unrestricted there, and masked out of
    every loss), and each row's move index.

    Raises:
        ValueError: a response that is not a legal move followed by EOS.
    """
    rows, moves = [], []
    for row, (trie, tokens) in enumerate(zip(tries, response.tolist(), strict=True)):
        allowed, move = trie.walk(tokens, eos_token_id)
        if move is None:
            raise ValueError(f"response {row} {tokens} is not a legal move of its row followed by EOS")
        rows.append(allowed)
        moves.append(move)
    width = max(len(a) for allowed in rows for a in allowed)
    out = torch.full((*response.shape, width), -1, dtype=torch.long)
    for row, allowed in enumerate(rows):
        for t, tokens in enumerate(allowed):
            out[row, t, : len(tokens)] = torch.tensor(tokens)
    return out.to(response.device), moves


def restrict_logits(logits: torch.Tensor, allowed: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """``logits`` (B, L, V) with −inf at every token that ``allowed`` (B, L, K, −1-padded) does not list at its
    position; positions whose K entries are all −1 are left as they are. Differentiable (the allowed logits' gradient
    passes through); ``inplace`` writes into ``logits``, also under autograd."""
    vocabulary = logits.shape[-1]
    index = allowed.to(logits.device).clamp_max(vocabulary - 1).masked_fill(allowed.to(logits.device) < 0, vocabulary)
    keep = torch.zeros((*logits.shape[:-1], vocabulary + 1), dtype=torch.bool, device=logits.device)
    keep.scatter_(-1, index, True)
    keep = keep[..., :vocabulary]
    keep |= (allowed < 0).all(-1, keepdim=True).to(logits.device)  # unrestricted positions
    return logits.masked_fill_(~keep, -torch.inf) if inplace else logits.masked_fill(~keep, -torch.inf)


def pad_allowed(allowed: torch.Tensor, length: int, width: int) -> torch.Tensor:
    """(B, L, K) -> (B, ``length``, ``width``) padded with −1 (unrestricted, masked positions; no move)."""
    return torch.nn.functional.pad(allowed, (0, width - allowed.shape[2], 0, length - allowed.shape[1]), value=-1)
