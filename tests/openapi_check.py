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


def _resolve(schema: Any, doc: dict[str, Any]) -> dict[str, Any]:
    """`schema` with its `$ref` (into `doc`) merged in, recursively (2020-12 allows siblings of $ref)."""
    while isinstance(schema, dict) and "$ref" in schema:
        target: Any = doc
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        schema = {**{k: v for k, v in schema.items() if k != "$ref"}, **target}
    return schema if isinstance(schema, dict) else {}


def _branches(schema: dict[str, Any], doc: dict[str, Any]) -> list[dict[str, Any]]:
    """`schema` and the branches of its anyOf / oneOf / allOf, resolved, recursively."""
    out = [schema]
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key, []):
            out += _branches(_resolve(sub, doc), doc)
    return out


def undocumented(value: Any, schema: Any, path: str = "$") -> list[str]:
    """Where `value` (an answer) has a member that `schema` (a schema of the document) does not list: an
    object schema with `properties` must name every member sent (one without is a free-form map, whose
    values follow `additionalProperties` when that is a schema). `jsonschema` cannot say it: the answers
    allow unknown members (a client ignores what it does not know), so a missing property validates."""
    doc = openapi_document()
    branches = _branches(_resolve(schema, doc), doc)
    out: list[str] = []
    if isinstance(value, dict):
        props: dict[str, Any] = {}
        extra: list[Any] = []
        for b in branches:
            props.update(b.get("properties", {}))
            if isinstance(b.get("additionalProperties"), dict):
                extra.append(b["additionalProperties"])
        if not props and not extra:
            return out  # free-form
        for key, sub in value.items():
            if key in props:
                out += undocumented(sub, props[key], f"{path}.{key}")
            elif extra:
                out += undocumented(sub, extra[0], f"{path}.{key}")
            else:
                out.append(f"{path}.{key}")
    elif isinstance(value, list):
        items = [b["items"] for b in branches if isinstance(b.get("items"), dict)]
        if items:
            for i, sub in enumerate(value):
                out += undocumented(sub, items[0], f"{path}[{i}]")
    return out
