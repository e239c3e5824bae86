"""Prompt templates: how a role's prompt is rendered from the sample and the earlier roles' responses."""

from __future__ import annotations

import difflib
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from marllm.envs.turns import describe_turn, turn_names

PromptFn = Callable[[Mapping[str, Any], Mapping[str, str]], str]
"""A callable template: ``prompt_fn(sample, responses) -> prompt`` where ``responses`` maps each earlier role
(its latest response) and each earlier turn name ``<role>_<k>`` to text."""


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

    def check(self, who: str, sample_fields: Sequence[str], earlier_roles: Sequence[str]) -> None:
        """Raise if the template names a field that is neither a sample column nor an earlier role or turn name;
        ``who`` names the turn in the message (``role 'critic'``)."""
        available = set(sample_fields) | set(earlier_roles)
        missing = [f for f in self.fields if f not in available]
        if missing:
            raise ValueError(
                f"prompt template of {who} uses unknown field(s) {missing}; available: sample columns "
                f"{sorted(sample_fields)} and earlier roles and turns {list(earlier_roles)}"
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


def check_template_keys(templates: Mapping[str, Any], roles: Sequence[str], turns: Sequence[str]) -> None:
    """Raise unless every turn has a template, keyed by its role or by its turn name, and no key is anything else."""
    names = turn_names(turns)
    unknown = sorted(set(templates) - set(roles) - set(names), key=str)
    untemplated = [t for t, n in zip(turns, names, strict=True) if t not in templates and n not in templates]
    missing = list(dict.fromkeys(untemplated))
    if unknown or missing:
        per_turn = f" (or per turn {names})" if len(names) > len(roles) else ""
        raise ValueError(
            f"templates must have one entry per role {list(roles)}{per_turn}; missing {missing}, unknown {unknown}"
        )


def check_templates(
    templates: Mapping[str, str | PromptFn] | Sequence[str | PromptFn],
    roles: list[str],
    columns: list[str],
    turns: list[str],
    dataset: Any = None,
) -> dict[str, PromptTemplate | PromptFn]:
    """One prompt function per turn name; a str template's fields must be columns or earlier roles and turns, and
    every row of ``dataset`` (when given) must hold a value for each column field (:func:`check_row_values`)."""
    names = turn_names(turns)
    if isinstance(templates, Mapping):
        check_template_keys(templates, roles, turns)
        by_role = dict(templates)
    else:
        ordered = list(templates)
        if len(ordered) != len(roles):
            raise ValueError(f"got {len(ordered)} templates for {len(roles)} roles {roles}; give one per role")
        by_role = dict(zip(roles, ordered, strict=True))
    checked = {}
    for k, (role, name) in enumerate(zip(turns, names, strict=True)):
        fn = as_prompt_fn(by_role.get(name, by_role.get(role)))
        if isinstance(fn, PromptTemplate):
            earlier = list(dict.fromkeys(turns[:k])) + names[:k]
            fn.check(describe_turn(turns, roles, k), columns, earlier)
            if dataset is not None:
                check_row_values(fn, describe_turn(turns, roles, k), dataset, earlier)
        checked[name] = fn
    return checked


def check_row_values(template: PromptTemplate, who: str, rows: Any, earlier: Sequence[str] = ()) -> None:
    """Refuse rows that hold no value (null, or no such key) for a sample field of ``template``: the prompt would
    read ``None``. ``rows`` is a ``datasets.Dataset`` or a list of dicts; ``earlier`` are the fields that are earlier
    turns' responses (not checked); ``who`` names the turn (``role 'seller'``).

    Raises:
        ValueError: naming the first such row (counting from 0), the field and the template's turn.
    """
    columns = getattr(rows, "column_names", None)
    for name in dict.fromkeys(template.fields):
        if name in earlier:
            continue
        if columns is not None:
            values = rows[name] if name in columns else ()
        else:
            values = [row.get(name) if isinstance(row, Mapping) else None for row in rows]
        for row, value in enumerate(values):
            if value is None:
                raise ValueError(
                    f"dataset row {row} (counting from 0) has no value for {name!r} (null or missing), which the "
                    f"prompt template of {who} uses; give every row a {name!r}, or leave {{{name}}} out of the template"
                )


# The fields of a config's ``env.templates``, checked when it is read, before any model or dataset loads: the columns
# are known only once the dataset loads, where the environment checks every field; what cannot be right is caught
# then: a malformed template, a role or turn that has not spoken yet, and a near miss of a role, a turn or ``query``.
QUERY = "query"  # every task's rows have it: the text the first prompt is made of


def check_template_fields(templates: Mapping[str, str], roles: Sequence[str], turns: Sequence[str]) -> None:
    """Refuse a template of ``templates`` (keyed by role or turn name, each turn having one) whose field is a role
    or turn that speaks at or after its turn, or a near miss of ``query`` or a role or turn.

    Raises:
        ValueError: ``env.templates.KEY: …`` naming the template, the field and the fields available to its turn.
    """
    names = turn_names(turns)
    speakers = [*dict.fromkeys(turns), *names]
    for k, (role, name) in enumerate(zip(turns, names, strict=True)):
        key = name if name in templates else role
        try:
            fields = PromptTemplate(templates[key]).fields
        except ValueError as error:
            raise ValueError(f"env.templates.{key}: {error}") from None
        earlier = [*dict.fromkeys(turns[:k]), *names[:k]]
        available = [QUERY, *earlier]
        for field in fields:
            if field in available:
                continue
            close = difflib.get_close_matches(field, [QUERY, *speakers], n=1, cutoff=0.8)
            if field not in speakers and not close:
                continue  # a dataset column, checked when the environment is built
            why = f" ({field} has not spoken yet)" if field in speakers else ""
            hint = f" (did you mean {{{close[0]}}}?)" if close and close[0] in available else ""
            raise ValueError(
                f"env.templates.{key}: field {{{field}}} is not available to {describe_turn(turns, roles, k)}{why}"
                f"{hint}; its template may use {{{QUERY}}}, the earlier roles and turns {earlier} and the dataset's "
                "columns"
            )
