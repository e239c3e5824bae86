"""Prompt templates: how a role's prompt is rendered from the sample and the earlier roles' responses."""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

PromptFn = Callable[[Mapping[str, Any], Mapping[str, str]], str]
"""A callable template: ``prompt_fn(sample, responses) -> prompt`` where ``responses`` maps earlier roles to text."""


class PromptTemplate:
    """A ``str.format`` template whose fields are sample columns or the names of earlier roles.

    ``'I can make this sentence "{query}{pioneer}" more positive: {query}'`` renders the observer prompt of CORY's
    sentiment task. Only plain field names are allowed (no attribute access or indexing), and every field must be
    available to the role: this is checked once, when the environment is built, not on the first sample.
    """

    def __init__(self, template: str):
        if not isinstance(template, str):
            raise TypeError(f"a prompt template must be a str, got {type(template).__name__}")
        self.template = template
        self.fields: tuple[str, ...] = tuple(_field_names(template))

    def check(self, role: str, sample_fields: Sequence[str], earlier_roles: Sequence[str]) -> None:
        """Raise if the template names a field that is neither a sample column nor an earlier role."""
        available = set(sample_fields) | set(earlier_roles)
        missing = [f for f in self.fields if f not in available]
        if missing:
            raise ValueError(
                f"prompt template of role {role!r} uses unknown field(s) {missing}; available: sample columns "
                f"{sorted(sample_fields)} and earlier roles {list(earlier_roles)}"
            )

    def __call__(self, sample: Mapping[str, Any], responses: Mapping[str, str]) -> str:
        return self.template.format_map({**sample, **responses})

    def __repr__(self) -> str:
        return f"PromptTemplate({self.template!r})"


def _field_names(template: str) -> list[str]:
    names = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as error:
        raise ValueError(
            f"prompt template {template!r} is malformed: {error} (write literal braces as {{{{ and }}}})"
        ) from error
    for _, field, _, _ in parsed:
        if field is None:
            continue
        if not field.isidentifier():
            raise ValueError(
                f"prompt template field {{{field}}} in {template!r} is not a plain name; use fields like "
                "{query} or {pioneer} (attribute access and indexing are not allowed)"
            )
        names.append(field)
    return names


def as_prompt_fn(template: str | PromptFn) -> PromptTemplate | PromptFn:
    """Accept a template string or a callable ``(sample, responses) -> str``."""
    if isinstance(template, str):
        return PromptTemplate(template)
    if callable(template):
        return template
    raise TypeError(f"a role template must be a str or a callable, got {type(template).__name__}")
