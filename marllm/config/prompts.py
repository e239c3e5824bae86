"""The fields of ``env.templates`` checked when the config is read, before any model or dataset loads.

A template's fields are sample columns or earlier roles and turns (:mod:`marllm.envs.templates`). The columns are
known only once the dataset loads, where the environment checks every field; what cannot be right is caught here: a
malformed template, a role or turn that has not spoken yet, and a near miss of a role, a turn or ``query`` (no
dataset column is named ``pionner``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from marllm.envs.templates import PromptTemplate
from marllm.envs.turns import describe_turn, turn_names

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
