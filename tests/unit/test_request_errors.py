"""Every refusal of a request model speaks Engram's voice: "field: must be ...", never pydantic's
("Input should be a valid boolean", "Value error, ...", class names). Pydantic's wording
showed in some 422s; this checks every field of every request model against wrong values."""

from __future__ import annotations

import inspect

import pytest
from pydantic import BaseModel, ValidationError

from services.query import models
from services.query.problems import pydantic_errors
from services.query.views import episodes, facts, forgetting, insights, listing, operations, updates

REQUEST_MODELS = [
    m
    for module in (models, episodes, listing, updates, forgetting, insights, facts, operations)
    for _, m in inspect.getmembers(module, inspect.isclass)
    if issubclass(m, BaseModel) and m.__module__ == module.__name__ and m.model_fields  # not the base
]
WRONG = [True, "nope", 1.5, -1, 10**12, [], {}, [1, "a"], {"x": 1}, None, "", ["a"] * 1001, "x" * 100_000]
FOREIGN = ("should", "Value error", "instance of", "dictionary", "pydantic", "type=", "after validation")


@pytest.mark.parametrize("model", REQUEST_MODELS, ids=lambda m: m.__name__)
def test_every_field_is_refused_in_engrams_words(model):
    seen = 0
    for name in model.model_fields:
        alias = model.model_fields[name].alias or name
        for value in WRONG:
            try:
                model.model_validate({alias: value})
            except ValidationError as exc:
                for field, reason in pydantic_errors(exc):
                    seen += 1
                    assert not any(f in reason for f in FOREIGN), (
                        model.__name__,
                        alias,
                        value,
                        field,
                        reason,
                    )
                    assert reason and field, (model.__name__, alias, value)
    assert seen, model.__name__  # something was refused


def test_a_literal_choice_and_a_boolean_read_as_ours():
    """A `mode` outside its choices and a `touch` that is not a boolean read in Engram's words."""
    with pytest.raises(ValidationError) as caught:
        models.RecallRequest.model_validate({"query": "x", "mode": "fast", "touch": "maybe"})
    assert dict(pydantic_errors(caught.value)) == {
        "mode": "must be one of 'vector', 'keyword' or 'hybrid'",
        "touch": "must be true or false, not a string",
    }


def test_list_lengths_read_as_ours():
    """List lengths too, not `List should have at least 1 item after validation, not 0` (POST /v1/forget)."""
    from services.query.views.forgetting import ForgetRequest

    said = {}
    for value in ([], ["a"] * 1001, "abc"):
        with pytest.raises(ValidationError) as caught:
            ForgetRequest.model_validate({"episode_ids": value})
        said.update({repr(value)[:12]: dict(pydantic_errors(caught.value))["episode_ids"]})
    assert list(said.values()) == [
        "must hold at least 1 item(s), not 0",
        "must hold at most 1000 items, not 1001",
        "must be a list, not a string",
    ]
