"""Validation against the service's OpenAPI document with `jsonschema` (2020-12, as OpenAPI 3.1 embeds it):
a validator for any schema of the document, `$ref`s resolved inside it."""

from __future__ import annotations

import functools
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from services.query.app import openapi_document

BASE = "urn:engram:openapi"


@functools.cache
def _registry() -> Registry:
    doc = openapi_document()
    return Registry().with_resource(BASE, Resource.from_contents(doc, default_specification=DRAFT202012))


def validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    """A validator of `schema`, a schema of the document (or a `$ref` into it)."""
    if set(schema) == {"$ref"} and schema["$ref"].startswith("#"):
        schema = {"$ref": BASE + schema["$ref"]}
    return jsonschema.Draft202012Validator(schema, registry=_registry())


def component(name: str) -> jsonschema.Draft202012Validator:
    return validator({"$ref": f"#/components/schemas/{name}"})


def _pointer(*parts: str) -> dict[str, Any]:
    """A `$ref` to the schema at `parts` of the document (so `$ref`s inside it resolve in the document)."""
    return {"$ref": "#/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)}


def success_schema(method: str, path: str) -> tuple[int, dict[str, Any]]:
    """The documented success status and JSON schema (a `$ref` into the document) of an operation
    (`/v1/facts/{fact_id}` form)."""
    op = openapi_document()["paths"][path][method.lower()]
    status = next(s for s in op["responses"] if s.startswith("2"))
    return int(status), _pointer(
        "paths", path, method.lower(), "responses", status, "content", "application/json", "schema"
    )


def ingest_schema() -> dict[str, Any]:
    """The `POST /v1/episodes` body's schema (a `$ref` into the document)."""
    return _pointer("paths", "/v1/episodes", "post", "requestBody", "content", "application/json", "schema")
