"""The OpenAPI 3.1 document of a route table (`services.query.routes.ROUTES`, handed over by `make_app`)
and the pydantic models' JSON schemas: each route's statuses, security and models come from its Route."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from services.query.answers import NAMED

if TYPE_CHECKING:  # the type only: the table is handed over, never imported
    from services.query.routes import Route

_PARAM = re.compile(r"\{(\w+)(?::[^}]*)?\}")

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "RFC 9457 problem details",
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"field": {"type": "string"}, "reason": {"type": "string"}},
                "required": ["field", "reason"],
            },
        },
        # extension members (RFC 9457 section 3.2) some problems carry, for a client to act on
        "lag": {"type": "integer", "description": "429: entries the consolidator is behind"},
        "max_lag": {"type": "integer", "description": "429: the lag past which ingest is refused"},
        "max_body_bytes": {"type": "integer", "description": "413: the largest request body, bytes"},
        "pending": {
            "type": "array",
            "items": {"type": "string"},
            "description": "503 while starting: what the service still waits for",
        },
    },
    "required": ["type", "title", "status"],
}


def openapi_path(path: str) -> str:
    """`/v1/episodes/{episode_id:.+}` → `/v1/episodes/{episode_id}`."""
    return _PARAM.sub(r"{\1}", path)


def _link(schema: Any) -> Any:
    """`schema` with each `answers.named(...)` marker replaced by its `$ref` (2020-12 allows siblings of
    $ref)."""
    if isinstance(schema, dict):
        out = {k: _link(v) for k, v in schema.items() if k != NAMED}
        if NAMED in schema:
            out["$ref"] = f"#/components/schemas/{schema[NAMED]}"
        return out
    if isinstance(schema, list):
        return [_link(v) for v in schema]
    return schema


def _schema(
    model: type[BaseModel],
    components: dict[str, Any],
    mode: Literal["validation", "serialization"] = "validation",
) -> dict[str, Any]:
    """Put `model`'s schema and those it refers to into `components`; returns its `$ref`. Two different
    schemas of one name (two models called `Fact`) are a ValueError, not one silently replacing the other."""
    schema = _link(model.model_json_schema(ref_template="#/components/schemas/{model}", mode=mode))
    for name, sub in [*schema.pop("$defs", {}).items(), (model.__name__, schema)]:
        if components.setdefault(name, sub) != sub:
            raise ValueError(f"two different schemas are named {name!r} in the OpenAPI document")
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }


def _responses(route: Route, components: dict[str, Any]) -> dict[str, Any]:
    """The documented responses of one route: its success status, then its error statuses."""
    success = route.response
    if route.answer is not None:
        success = {
            "description": (route.answer.__doc__ or "OK").split("\n\n")[0],
            "content": {
                "application/json": {"schema": _schema(route.answer, components, mode="serialization")}
            },
        }
    responses: dict[str, Any] = {str(route.status): success}
    for s in route.errors:
        responses[str(s.code)] = _problem(s.description) if s.problem else {"description": s.description}
    return responses


PAGE_FILES = ("/docs/", "/console/")
"""The prefixes of the docs page's and the console's own files (scripts, stylesheets, icon): served, but
not operations of the API, so the document leaves them out (a client generator would make a method of
each, and warns of their non-JSON answers). The pages themselves, `GET /docs` and `GET /console`, stay."""


def document(routes: Iterable[Route], schemas: Mapping[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The document of `routes` but PAGE_FILES (make_app builds it once, on the first GET /openapi.json);
    `schemas` are named components the routes' models refer to (`services.query.answers.SCHEMAS`: the
    episode)."""
    components: dict[str, Any] = {"Problem": PROBLEM_SCHEMA, **(schemas or {})}
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        if route.path.startswith(PAGE_FILES):
            continue
        path = openapi_path(route.path)
        op: dict[str, Any] = {
            "summary": route.summary,
            "operationId": route.handler.__name__,
            "tags": [route.tag],
        }
        params = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
            for name in _PARAM.findall(route.path)
        ]
        if route.query is not None:
            schema = route.query.model_json_schema()
            for name, prop in schema.get("properties", {}).items():
                params.append(
                    {
                        "name": name,
                        "in": "query",
                        "required": name in schema.get("required", []),
                        "schema": prop,
                    }
                )
        if params:
            op["parameters"] = params
        if route.body is not None:
            body_schema = _schema(route.body, components) if isinstance(route.body, type) else route.body
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body_schema}}}
        responses = _responses(route, components)
        if not route.public:
            op["security"] = [{"bearer": []}]
        op["responses"] = responses
        paths.setdefault(path, {})[route.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Engram query service",
            "version": "1",
            "description": "Episodic memory for LLM agents: prioritized recall and the HTTP API.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
