"""An OpenAI-compatible embedding server for side-by-side benchmarks (`bench.peer`).

    python -m bench.embed_server [--host 127.0.0.1] [--port 0] [--models minilm,mpnet]
        [--threads 2] [--max-batch 256]

Serves `POST /v1/embeddings` the way OpenAI's API does (`{"model", "input": str | [str],
"encoding_format": "float" | "base64", "dimensions"}` → `{"object": "list", "data": [{"object":
"embedding", "index": i, "embedding": [...]}], "model", "usage"}`) from the models Engram ships
(`shared.embedding`: MiniLM as `all-minilm-l6-v2`, mpnet as `all-mpnet-base-v2`, on OpenVINO as in
Engram), so every system in a comparison pays the
same model cost per text. Also `GET /v1/models`, `GET /health` (200 once the models are loaded: the
port opens only then) and `GET /stats` (requests, texts, forward passes, seconds spent in the model).

Concurrent requests share forward passes, as embedding servers do (TEI, vLLM, Infinity batch
dynamically): while a pass runs, arriving requests wait, and the next pass embeds all of their texts,
up to `--max-batch` texts (a larger request runs alone, in the embedder's own `batch_size` chunks). No
waiting window: a lone request starts at once. Without this a server would serialise one request per
pass, and a client that sends single queries (every memory server does for a recall) would pay for a
queue that no real embedding server has.

Errors are OpenAI-shaped `{"error": {"message", "type", "param", "code"}}`: 400 naming the field for
bad input, 404 for an unknown model. `--port 0` picks a free port; the chosen one is printed as
`embed_server listening on http://HOST:PORT` once the models are loaded.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from shared.embedding import Embedder, make_embedder
from shared.settings import Settings

log = logging.getLogger("engram.bench.embed_server")

MODELS = {"minilm": "all-minilm-l6-v2", "mpnet": "all-mpnet-base-v2"}
"""Engram embedder name → the model name the server answers to."""
_ALIASES = {
    "all-minilm-l6-v2": "minilm",
    "sentence-transformers/all-minilm-l6-v2": "minilm",
    "minilm": "minilm",
    "all-mpnet-base-v2": "mpnet",
    "sentence-transformers/all-mpnet-base-v2": "mpnet",
    "mpnet": "mpnet",
}


def model_key(name: str) -> str | None:
    """A request's `model` → "minilm" / "mpnet", case-insensitive; None when unknown."""
    return _ALIASES.get(name.strip().lower())


class RequestError(Exception):
    """A request the server refuses: HTTP `status`, OpenAI error `param` and message."""

    def __init__(self, status: int, param: str | None, message: str, code: str = "invalid_request"):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


def parse_request(body: Any) -> tuple[str, list[str], str, int | None]:
    """A `/v1/embeddings` body → (model key, texts, encoding_format, dimensions or None).

    Raises RequestError (400 naming the field, 404 for an unknown model)."""
    if not isinstance(body, dict):
        raise RequestError(400, None, "the body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise RequestError(400, "model", "model: a model name is required")
    key = model_key(model)
    if key is None:
        raise RequestError(
            404,
            "model",
            f"model: {model!r} is not served (known: {', '.join(MODELS.values())})",
            "model_not_found",
        )
    raw = body.get("input")
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not texts:
        raise RequestError(400, "input", "input: a string or a non-empty list of strings is required")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise RequestError(400, "input", f"input[{i}]: must be a string (token arrays are not supported)")
        if not text.strip():
            raise RequestError(400, "input", f"input[{i}]: must not be empty")
    encoding = body.get("encoding_format", "float")
    if encoding is None:
        encoding = "float"
    if encoding not in ("float", "base64"):
        raise RequestError(400, "encoding_format", "encoding_format: must be 'float' or 'base64'")
    dims = body.get("dimensions")
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or dims < 1):
        raise RequestError(400, "dimensions", "dimensions: must be a positive integer")
    return key, texts, encoding, dims


@dataclass
class Stats:
    """Counters since start: requests answered, texts embedded, forward passes, model seconds."""

    requests: int = 0
    texts: int = 0
    passes: int = 0
    model_seconds: float = 0.0


@dataclass
class _Waiting:
    texts: list[str]
    future: asyncio.Future[np.ndarray]


@dataclass
class PassSharer:
    """Requests to one embedder share forward passes: while a pass runs, new requests queue; the next
    pass embeds the queued requests' texts together (up to `max_batch` texts, whole requests only, at
    least one). A pass that fails fails the requests in it. One event loop; not thread-safe."""

    embedder: Embedder
    max_batch: int = 256
    stats: Stats = field(default_factory=Stats)
    _queue: list[_Waiting] = field(default_factory=list)
    _running: bool = False

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32[len(texts), dim], unit rows. Raises what the embedder raises."""
        loop = asyncio.get_running_loop()
        waiting = _Waiting(list(texts), loop.create_future())
        self._queue.append(waiting)
        if not self._running:
            self._running = True
            loop.create_task(self._drain())
        return await waiting.future

    async def _drain(self) -> None:
        try:
            while self._queue:
                take, n = 0, 0
                while take < len(self._queue) and (
                    take == 0 or n + len(self._queue[take].texts) <= self.max_batch
                ):
                    n += len(self._queue[take].texts)
                    take += 1
                batch, self._queue = self._queue[:take], self._queue[take:]
                started = time.perf_counter()
                try:
                    vectors = await self.embedder.embed([t for w in batch for t in w.texts])
                except Exception as exc:  # noqa: BLE001 - answered to each waiting request
                    for w in batch:
                        if not w.future.done():
                            w.future.set_exception(exc)
                    continue
                finally:
                    self.stats.passes += 1
                    self.stats.texts += n
                    self.stats.model_seconds += time.perf_counter() - started
                offset = 0
                for w in batch:
                    if not w.future.done():
                        w.future.set_result(vectors[offset : offset + len(w.texts)])
                    offset += len(w.texts)
        finally:
            self._running = False


SHARERS = web.AppKey("sharers", dict[str, PassSharer])


def encode_vector(vector: np.ndarray, encoding: str) -> np.ndarray | str:
    """One row as OpenAI sends it: float32 numbers (serialised by orjson as a JSON list), or base64 of
    little-endian float32 bytes."""
    if encoding == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return np.asarray(vector, dtype=np.float32)


def _json(payload: Any, status: int = 200) -> web.Response:
    # orjson writes a float32 row several times faster than json.dumps of Python floats: the server's
    # own cost per request is part of every system's recall, so it is kept small
    return web.Response(
        body=orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY),
        status=status,
        content_type="application/json",
    )


def _error(exc: RequestError) -> web.Response:
    kind = "invalid_request_error" if exc.status < 500 else "server_error"
    return web.json_response(
        {"error": {"message": str(exc), "type": kind, "param": exc.param, "code": exc.code}},
        status=exc.status,
    )


async def embeddings(request: web.Request) -> web.Response:
    """`POST /v1/embeddings` (OpenAI's shape; see the module docstring)."""
    try:
        try:
            body = await request.json()
        except ValueError:
            raise RequestError(400, None, "the body is not JSON") from None
        key, texts, encoding, dims = parse_request(body)
        sharer = request.app[SHARERS].get(key)
        if sharer is None:
            raise RequestError(
                404, "model", f"model: {body['model']!r} is not loaded by this server", "model_not_found"
            )
        if dims is not None and dims != sharer.embedder.dim:
            raise RequestError(
                400, "dimensions", f"dimensions: {MODELS[key]} gives {sharer.embedder.dim}, not {dims}"
            )
    except RequestError as exc:
        return _error(exc)
    try:
        vectors = await sharer.embed(texts)
    except ValueError as exc:  # the embedder's own refusal of a text
        return _error(RequestError(400, "input", f"input: {exc}"))
    except Exception as exc:  # noqa: BLE001 - reported to the client as OpenAI does, never a traceback
        log.exception("embedding failed")
        return _error(
            RequestError(503, None, f"embedding failed: {type(exc).__name__}: {exc}", "server_error")
        )
    sharer.stats.requests += 1
    tokens = sum(len(t.split()) for t in texts)  # a word count: only the shape matters to clients
    return _json(
        {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": encode_vector(v, encoding)}
                for i, v in enumerate(vectors)
            ],
            "model": MODELS[key],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


async def models(request: web.Request) -> web.Response:
    """`GET /v1/models`: the loaded models, OpenAI-shaped."""
    data = [{"id": MODELS[k], "object": "model", "owned_by": "engram-bench"} for k in request.app[SHARERS]]
    return web.json_response({"object": "list", "data": data})


async def health(request: web.Request) -> web.Response:
    """`GET /health`: 200 with the models and their dimensions (the port opens once they are loaded)."""
    sharers = request.app[SHARERS]
    return web.json_response(
        {
            "models": {MODELS[k]: s.embedder.dim for k, s in sharers.items()},
        }
    )


async def stats(request: web.Request) -> web.Response:
    """`GET /stats`: per model, requests, texts, passes and model seconds since start."""
    return web.json_response({MODELS[k]: vars(s.stats) for k, s in request.app[SHARERS].items()})


def make_app(embedders: dict[str, Embedder], *, max_batch: int = 256) -> web.Application:
    """The server's application over loaded embedders keyed "minilm" / "mpnet". The embedders are the
    caller's to close. Body limit 64 MiB (a few thousand long texts per request)."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[SHARERS] = {k: PassSharer(e, max_batch=max_batch) for k, e in embedders.items()}
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/embeddings", embeddings)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
    return app


async def load_embedders(names: Sequence[str], *, threads: int) -> dict[str, Embedder]:
    """Engram's embedders for `names` ("minilm", "mpnet"), loaded. Raises ConfigError when a model's
    packages are missing, ValueError for an unknown name."""
    out: dict[str, Embedder] = {}
    for name in names:
        if name not in MODELS:
            raise ValueError(f"--models: {name!r} is not one of {', '.join(MODELS)}")
        embedder = make_embedder(Settings(embedder=name, embed_threads=threads))
        await embedder.load()  # type: ignore[attr-defined]  # the model embedders have load()
        await embedder.embed(["warm up"])
        out[name] = embedder
    return out


async def serve(args: argparse.Namespace) -> None:
    from deploy.embedded_redis import free_port

    embedders = await load_embedders(args.models, threads=args.threads)
    runner = web.AppRunner(make_app(embedders, max_batch=args.max_batch), access_log=None)
    await runner.setup()
    port = args.port or free_port()
    await web.TCPSite(runner, args.host, port).start()
    print(f"embed_server listening on http://{args.host}:{port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        for e in embedders.values():
            await e.aclose()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.embed_server", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    p.add_argument("--models", default="minilm", type=lambda s: [m for m in s.split(",") if m])
    p.add_argument("--threads", type=int, default=2, help="inference threads of each model")
    p.add_argument("--max-batch", type=int, default=256, help="texts per shared forward pass")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
