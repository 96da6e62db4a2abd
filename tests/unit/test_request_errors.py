"""Every refusal of a request model speaks Engram's voice: "field: must be ...", never pydantic's
("Input should be a valid boolean", "Value error, ...", class names). A new-user trial met pydantic's
wording in some 422s; this checks every field of every request model against wrong values."""

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
WRONG = [True, "nope", 1.5, -1, 10**12, [], {}, [1, "a"], {"x": 1}, None, ""]
FOREIGN = ("Input should", "Value error", "instance of", "dictionary", "pydantic", "type=")


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


def test_the_two_pydantic_checks_the_trial_met_read_as_ours():
    with pytest.raises(ValidationError) as caught:
        models.RecallRequest.model_validate({"query": "x", "mode": "fast", "touch": "maybe"})
    assert dict(pydantic_errors(caught.value)) == {
        "mode": "must be one of 'vector', 'keyword' or 'hybrid'",
        "touch": "must be true or false",
    }
