"""The OpenAPI 3.1 document, built from `routes.ROUTES` and the pydantic models' JSON schemas."""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from services.query.auth import PUBLIC_PATHS

if TYPE_CHECKING:  # routes imports this module
    from services.query.routes import Route

_PARAM = re.compile(r"\{(\w+)(?::[^}]*)?\}")

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "RFC 9457 problem details",
    "properties": {
        "type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"},
        "detail": {"type": "string"},
        "errors": {"type": "array", "items": {"type": "object", "properties": {
            "field": {"type": "string"}, "reason": {"type": "string"}}, "required": ["field", "reason"]}},
    },
    "required": ["type", "title", "status"],
}


def openapi_path(path: str) -> str:
    """`/v1/episodes/{episode_id:.+}` → `/v1/episodes/{episode_id}`."""
    return _PARAM.sub(r"{\1}", path)


def _schema(model: type[BaseModel], components: dict[str, Any]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, sub in schema.pop("$defs", {}).items():
        components[name] = sub
    components[model.__name__] = schema
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _problem(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/problem+json": {
        "schema": {"$ref": "#/components/schemas/Problem"}}}}


def _responses(route: Route, *, has_params: bool) -> dict[str, Any]:
    """The documented responses of one route."""
    responses: dict[str, Any] = {str(route.status): {"description": "OK", "content": {
        "application/json": {"schema": {"type": "object"}}}}}
    if route.body is not None:
        responses["400"] = _problem("malformed JSON")
        responses["413"] = _problem("body too large")
    if route.body is not None or route.query is not None or has_params:
        responses["422"] = _problem("invalid fields, each named in `errors`")
    if "{" in route.path:
        responses["404"] = _problem("not in the caller's namespace")
    if route.path not in PUBLIC_PATHS:
        responses["401"] = _problem("missing or invalid API key")
    if route.path == "/readyz":
        responses["503"] = {"description": "not ready"}
    if route.path == "/metrics":
        responses["200"] = {"description": "Prometheus text exposition format",
                            "content": {"text/plain": {"schema": {"type": "string"}}}}
        responses["401"] = _problem("with API keys configured: missing or invalid ENGRAM_METRICS_KEY")
        responses["403"] = _problem("a tenant's API key: metrics span every namespace")
    if route.status == 202:  # publishing routes
        responses["503"] = _problem("Redis did not accept the event; nothing was published (Retry-After)")
    if route.handler.__name__ == "ingest":
        responses["429"] = _problem("consumer lag above ENGRAM_MAX_LAG; nothing was published (Retry-After)")
    return responses


@functools.cache
def document() -> dict[str, Any]:
    from services.query.routes import ROUTES

    components: dict[str, Any] = {"Problem": PROBLEM_SCHEMA}
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        path = openapi_path(route.path)
        op: dict[str, Any] = {"summary": route.summary, "operationId": route.handler.__name__,
                              "tags": [route.tag]}
        params = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                  for name in _PARAM.findall(route.path)]
        if route.query is not None:
            schema = route.query.model_json_schema()
            for name, prop in schema.get("properties", {}).items():
                params.append({"name": name, "in": "query", "required": name in schema.get("required", []),
                               "schema": prop})
        if params:
            op["parameters"] = params
        if route.body is not None:
            body_schema = (_schema(route.body, components) if isinstance(route.body, type)
                           else route.body)
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body_schema}}}
        responses = _responses(route, has_params=bool(params))
        if route.path not in PUBLIC_PATHS:
            op["security"] = [{"bearer": []}]
        op["responses"] = responses
        paths.setdefault(path, {})[route.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "Engram query service", "version": "1",
                 "description": "Episodic memory for LLM agents: prioritized recall and the HTTP API."},
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
