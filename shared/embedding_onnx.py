"""ONNX Runtime backend for the sentence-transformers embedders (MiniLM, MPNet): the same weights, a
cheaper forward pass.

`shared.embedding_graphs.load_onnx(...)` returns an `OnnxSentenceModel` (this module's, or
`shared.embedding_openvino`'s subclass) that `MiniLMEmbedder` uses in place of the torch
`SentenceTransformer`, or None with the reason logged (the embedder then runs torch):

- Export, once per model for every process: the transformer of the installed sentence-transformers
  model is exported with `torch.onnx.export` (TorchScript exporter; the dynamo one needs onnxscript)
  into `<cache_dir>/<name>-onnx/model.onnx`, then quantised to `model-int8.onnx` with ONNX Runtime's
  dynamic int8 quantisation (int8 weights per output channel, activations quantised per call). A file
  lock (`<name>-onnx.lock`) makes one process export while the others wait; the directory is written
  beside and renamed into place, so nobody reads half an export. Nothing is downloaded: the weights
  come from the installed packages, the export runs locally (about 15-40 s for mpnet on 2 cores).
- Agreement gate: before either graph is used, its vectors for `AGREEMENT_TEXTS` are compared with the
  torch model's (cosine per text). `manifest.json` records the mean and minimum per variant; a
  variant below `MIN_MEAN` / `MIN_ROW` is never used. The gate runs once, at export; a later start
  reads the manifest (and re-exports when the source model, the recipe or onnxruntime changed).
- Queries have a gate of their own (`QUERY_AGREEMENT_TEXTS`, `MIN_QUERY_MEAN` / `MIN_QUERY_ROW`, measured
  at export as `manifest[variant]["query"]`): `load_onnx(..., role="query")` (the query service's
  embedder) runs a graph that agrees on short questions, whatever the documents' gate said of it.
- The int8 graph embeds one text per pass (`OnnxSentenceModel.encode_counted`): its activations are
  quantised with one scale per pass, so in a batch a vector depended on its neighbours. One text per
  pass, mpnet's int8 graph agrees with torch at 0.991 on the gate's texts (refused for documents: it
  lowered LoCoMo's NDCG@10) and on its questions (used for queries, with no LoCoMo loss).
- The FFN output projections (`layer.N/output/dense`) stay float32 in the int8 graph: their input
  (after GELU) has a few outlier features that one per-tensor activation scale cannot hold. Quantised
  too, mpnet agreed with torch at 0.68 mean cosine on LoCoMo turns; kept float, 0.989.

Inference: the tokenizer is the model's own `tokenizer.json` (Hugging Face `tokenizers`, cutting at
the model's `max_seq_length` word pieces), mean pooling over the attention mask in numpy, then L2
normalisation. A call's texts are sorted by word-piece count and run in passes padded only to their
own longest (`length_batches`), rows returned in input order. It does not import torch, so a start with
the export cached skips torch's import. Threads: `intra_op_num_threads=threads`, one inter-op thread, and no spin-waiting (idle ORT threads
otherwise spin and take CPU from the event loop and the other processes on a small host).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from shared.embed_progress import held

log = logging.getLogger("engram.embedding")

OPENVINO = "openvino-bf16"
"""The float graph run by OpenVINO in bfloat16 where the CPU computes it natively (shared/embedding_openvino.py)."""
OPENVINO_INT8 = "openvino-int8"
"""The float graph with int8 weights per output channel and activations quantised per word piece, run
by OpenVINO on the cores' int8 units (shared/embedding_openvino.py)."""
OPENVINO_VARIANTS = (OPENVINO, OPENVINO_INT8)
BACKENDS = ("auto", "torch", "onnx", "onnx-int8", OPENVINO, OPENVINO_INT8)
"""`ENGRAM_EMBED_BACKEND`: auto (int8 ONNX when it passes the gate, else OpenVINO bf16 where the CPU has
it and it passes, else float ONNX, else torch), torch, onnx (float32 graph), onnx-int8 or openvino-bf16."""

RECIPE = "engram-onnx-4"  # bump when the export or the quantisation changes: caches re-export
FILES = {"onnx": "model.onnx", "onnx-int8": "model-int8.onnx"}
MIN_MEAN = {"onnx": 0.999, "onnx-int8": 0.993, OPENVINO: 0.999, OPENVINO_INT8: 0.998}
"""Least mean cosine to torch over AGREEMENT_TEXTS for a variant to store document vectors. The float
graph is the same computation (1.0000 measured). Int8, one text per pass: MiniLM 0.996 (used); mpnet
0.991, refused: with it LoCoMo's real path lost NDCG@10 -0.84 [-1.32, -0.36] and R@10 -0.90 [-1.78,
-0.03] against the float graph, so the bar sits above it; 0.99 was the first bar, measured on batched
passes."""
MIN_ROW = {"onnx": 0.99, "onnx-int8": 0.95, OPENVINO: 0.99, OPENVINO_INT8: 0.99}
"""Least cosine of any single text: a mean can hide one text the graph gets badly wrong."""
MIN_QUERY_MEAN = 0.99
"""Least mean cosine to torch over QUERY_AGREEMENT_TEXTS for a variant to embed queries ("≥ 0.99
mean"), measured on what the query service embeds (short questions) rather than on stored texts,
since a query vector is compared with stored vectors and never stored."""
MIN_QUERY_ROW = 0.95
AUTO_ORDER = ("onnx-int8", OPENVINO_INT8, OPENVINO, "onnx")
"""The graphs `auto` tries, fastest first, for documents and for a model that sets no order of its own:
one int8 text per pass (MiniLM; mpnet's misses the documents' bar), then OpenVINO's int8 products, then
bfloat16, then float. The two OpenVINO variants are one choice (`shared.embedding_graphs._groups`): the faster on the host's
CPU, measured there once (`shared.embedding_openvino.load_fastest`): mpnet's documents on OPENVINO_INT8
ran 61.7 LoCoMo turns/s against 36.8 on bfloat16 on an AMD EPYC, bfloat16 1.44x int8's on a Xeon with
AMX; R@5 / R@10 / NDCG@10 unchanged within their 95% intervals between them."""

QUERY_ORDERS = {"mpnet-base-v2": (OPENVINO_INT8, OPENVINO, "onnx-int8", "onnx")}
"""The order `auto` tries for a model's queries where it is not AUTO_ORDER. mpnet: OpenVINO first, as
its rows do not depend on their pass, so concurrent queries share one; of its two variants the faster
on the host (8 questions in one pass 46-55 ms on int8 against 67-71 on bfloat16 on an AMD EPYC; 42.5
against 36.0 on a Xeon with AMX). Not MiniLM: OpenVINO's cost per pass outweighs a model that small
(15-22 ms against 7-8 for a lone query)."""

ROLES = ("document", "query")
"""What an embedder's vectors are for: "document" vectors are stored (every variant's gate is the
documents' one), "query" vectors are only compared with stored ones (the queries' gate)."""
SETTING = {"document": "ENGRAM_EMBED_BACKEND", "query": "ENGRAM_QUERY_EMBED_BACKEND"}
"""The setting that picks each role's backend, as log lines name it."""

AGREEMENT_TEXTS = (
    "fix the flaky payment parser test",
    "Deploy failed: the migration timed out after 30 s on the orders table",
    "User prefers dark mode and answers in French",
    "Caroline: I went to a LGBTQ support group yesterday and it was so powerful.",
    "Melanie: Wow, that's cool! What did you learn there?",
    "The customer asked for a refund because the parcel arrived damaged.",
    "Retry the request with exponential backoff when the server answers 429",
    "login page returns 500 when the session cookie is missing",
    "We hiked up to the lake on Saturday; the kids loved the waterfall.",
    "Remember: the staging database is read-only on Fridays.",
    "The agent summarised the quarterly report and flagged three anomalies in the revenue table.",
    "kubectl rollout undo deployment/api --to-revision=3",
    "SELECT count(*) FROM episodes WHERE status = 'completed' AND namespace = 'default';",
    "Traceback (most recent call last): File 'app.py', line 12, in <module> KeyError: 'user_id'",
    "She adopted a rescue dog named Biscuit last spring and takes him to the beach every weekend.",
    "Book a table for four at the Italian place near the office, 7 pm Thursday.",
    "The CI job fails only on ARM runners; x86 passes. Suspect an alignment bug in the hash function.",
    "Ich habe den Fehler im Parser behoben, der Test läuft jetzt stabil.",
    "El cliente quiere cambiar la dirección de entrega del pedido 4521.",
    "用户喜欢简洁的回答，不要太长。",
    "ok",
    "thanks!",
    "What did I tell you about my sister's wedding plans last month?",
    "The image resizer crashes on PNG files with an alpha channel larger than 4096 px.",
    "Audit log entries are retained for seven years to meet the compliance requirement.",
    "Jon: I lost my job as a banker, so I'm starting my own dance studio.",
    "Gina: That's brave! I opened an online clothing store after I was laid off.",
    "Rate limiter: 100 requests per minute per API key, burst of 20.",
    "The recommendation model overfits; add dropout 0.1 and early stopping on validation loss.",
    "My favourite book as a child was Charlotte's Web; I still read it to my daughter.",
    "Cache warmup takes 40 minutes after a cold start because every shard rebuilds its index.",
    "Pay the electricity bill before the 15th and send the receipt to the landlord.",
    (
        "Long note: the billing export job reads every invoice of the month, converts the amounts to "
        "the account's currency with the daily rate, and writes one CSV per customer to the bucket. It "
        "failed three times this week because the rate service was slow; we added a timeout of ten "
        "seconds, a retry with backoff, and a fallback to yesterday's rate, logged as a warning so the "
        "finance team can check the affected invoices by hand before they are sent."
    ),
    (
        "Session summary: we discussed the new onboarding flow, agreed that the welcome email goes out "
        "after the first project is created rather than at sign-up, and that the tutorial can be "
        "skipped. Open questions: who owns the analytics dashboard, and whether the evaluation period "
        "is 14 or 30 days. Next meeting on Tuesday with design and support."
    ),
)


QUERY_AGREEMENT_TEXTS = (
    "how did we fix the flaky payment parser test?",
    "why did the deploy fail last time?",
    "what does the user prefer for the UI theme?",
    "which language should I answer this user in?",
    "what happened at the support group meeting?",
    "refund policy for damaged parcels",
    "how to handle HTTP 429 from the billing API",
    "login returns 500 without a session cookie",
    "where did we go hiking with the kids?",
    "is the staging database writable on Fridays?",
    "anomalies found in the quarterly revenue report",
    "how do I roll back the api deployment?",
    "query to count completed episodes in a namespace",
    "KeyError user_id in app.py",
    "what is the name of her dog?",
    "when is the dinner reservation?",
    "why does CI fail only on ARM runners?",
    "Wie habe ich den Parser-Fehler behoben?",
    "¿Cuál es la nueva dirección de entrega del pedido 4521?",
    "用户喜欢什么样的回答？",
    "status?",
    "what did I say about my sister's wedding?",
    "image resizer crash with large PNG files",
    "how long are audit logs kept?",
    "what job did he have before opening the dance studio?",
    "when did she open her clothing store?",
    "rate limit per API key",
    "how to stop the recommendation model overfitting",
    "favourite childhood book",
    "why is cache warmup slow after a cold start?",
    "when is the electricity bill due?",
    "what went wrong with the billing export job this week and what did we change?",
)
"""What a recall's `query` looks like (short questions and keyword lists, several languages): the
texts of the queries' gate, written for it (no benchmark's questions)."""


@dataclass(frozen=True, slots=True)
class Agreement:
    """Cosine agreement of one ONNX variant with the torch model: `mean` and `min` over `n` texts."""

    mean: float
    min: float
    n: int

    def passes(self, variant: str, role: str = "document") -> bool:
        """Whether the variant may embed texts of `role` (ROLES): its gate's mean and least cosine."""
        least_mean, least_row = bars(variant, role)
        return self.mean >= least_mean and self.min >= least_row


def on_queries(variant: str, role: str) -> bool:
    """Whether `variant` embedding texts of `role` is gated on the queries' texts and bars: the int8
    graph embedding queries. The float graph is the same computation as torch, gated on its own figures."""
    return role == "query" and variant == "onnx-int8"


def bars(variant: str, role: str) -> tuple[float, float]:
    """(least mean, least single cosine) the gate of `variant` embedding texts of `role` asks for."""
    if on_queries(variant, role) or (role == "query" and variant in OPENVINO_VARIANTS):
        return MIN_QUERY_MEAN, MIN_QUERY_ROW
    return MIN_MEAN[variant], MIN_ROW[variant]


def gate_of(manifest: dict[str, Any], variant: str, role: str) -> Agreement | None:
    """The Agreement that decides whether `variant` embeds texts of `role`: the documents' (the
    manifest's own figures; also a float graph's for queries, which is the same computation) or, for
    an int8 graph embedding queries, the queries' (None when the export did not measure it, or the
    figures are not numbers)."""
    figures = manifest.get(variant)
    if on_queries(variant, role) and isinstance(figures, dict):
        figures = figures.get("query")
    if not isinstance(figures, dict):
        return None
    mean, least, n = figures.get("mean"), figures.get("min"), figures.get("n")
    # edited by hand or cut short (a string, true, 7.0, inf, NaN, n 0): the variant counts as not measured
    cosines = [x for x in (mean, least) if isinstance(x, float | int) and not isinstance(x, bool)]
    if len(cosines) < 2 or not all(-1.0 <= x <= 1.0 for x in cosines):
        return None
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return None
    return Agreement(mean=float(cosines[0]), min=float(cosines[1]), n=n)


def agreement(reference: np.ndarray, candidate: np.ndarray) -> Agreement:
    """Row-wise cosine of two float[n, dim] arrays (any norm) → Agreement. Raises ValueError on shapes."""
    if reference.shape != candidate.shape or reference.ndim != 2:
        raise ValueError(f"shapes differ: {reference.shape} vs {candidate.shape}")
    a = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    b = candidate / np.linalg.norm(candidate, axis=1, keepdims=True)
    cos = (a * b).sum(axis=1)
    return Agreement(mean=float(cos.mean()), min=float(cos.min()), n=int(cos.size))


class OnnxSentenceModel:
    """One exported graph with its tokenizer: texts → mean-pooled, L2-normalised float32[n, dim].

    `encode_counted(texts, batch_size)` returns the vectors and, per text, whether the tokenizer cut it
    to `max_seq_length` word pieces. Thread-safe for concurrent calls (ONNX Runtime sessions are).
    """

    def __init__(self, graph: Path, model_dir: Path, *, max_seq_length: int, threads: int, variant: str):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.dim = int(self.session.get_outputs()[0].shape[-1])
        self._tokenizer(model_dir, max_seq_length, variant)

    def _tokenizer(self, model_dir: Path, max_seq_length: int, variant: str) -> None:
        from tokenizers import Tokenizer

        self.variant = variant
        self.max_seq_length = max_seq_length
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        tokenizer.enable_truncation(max_seq_length)
        tokenizer.no_padding()  # each pass pads to its own longest text (`encode_counted`)
        pad_id = tokenizer.token_to_id(_pad_token(model_dir))
        if pad_id is None:
            raise ValueError(f"the tokenizer at {model_dir} has no id for its padding token")
        self.pad_id = int(pad_id)
        self.tokenizer = tokenizer

    def _hidden(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        """The graph's last hidden state, float32[rows, pieces, dim], for one padded pass."""
        return cast(np.ndarray, self.session.run(None, feed)[0])

    def get_embedding_dimension(self) -> int:
        return self.dim

    def encode_counted(self, texts: list[str], batch_size: int) -> tuple[np.ndarray, list[bool]]:
        """Texts → (float32[len(texts), dim] unit rows in input order, [cut to the window?]).

        The texts are tokenised once, sorted by word-piece count and cut into passes of at most
        `batch_size` texts by `length_batches`, each pass padded only to its own longest text: padding
        is computed like real word pieces, and a pass of 64 LoCoMo turns in arrival order was 2.2×
        their word pieces. The attention mask keeps the
        padding out of every row, so a float row does not depend on its neighbours beyond rounding.
        The int8 graph runs one text per pass: its activations are quantised with one scale per
        tensor, computed over the whole pass, so a row in a batch moved with its neighbours (mpnet:
        cosine 0.991-0.993 to the same question alone; MiniLM 0.995) and a vector would depend on
        what else was embedded with it: another tenant's query, a replay's other batch."""
        n = len(texts)
        if self.variant == "onnx-int8":
            batch_size = 1
        if not n:
            return np.zeros((0, self.dim), dtype=np.float32), []
        encodings = self.tokenizer.encode_batch(texts)
        order = sorted(range(n), key=lambda i: len(encodings[i].ids))
        lengths = [len(encodings[i].ids) for i in order]
        out = np.empty((n, self.dim), dtype=np.float32)
        for part in length_batches(lengths, batch_size):
            rows = order[part.start : part.stop]
            ids = np.full((len(rows), lengths[part.stop - 1]), self.pad_id, dtype=np.int64)
            mask = np.zeros_like(ids)
            for k, i in enumerate(rows):
                piece_ids = encodings[i].ids
                ids[k, : len(piece_ids)] = piece_ids
                mask[k, : len(piece_ids)] = 1
            feed = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self.inputs:
                feed["token_type_ids"] = np.zeros_like(ids)
            hidden = self._hidden(feed)
            weights = mask[..., None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            out[rows] = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
        return out, [bool(e.overflowing) for e in encodings]


BATCH_OVERHEAD_TOKENS = 64
"""What one more ONNX pass costs, in padded word pieces, for `length_batches`: a pass of few short rows
uses the matrix units less well (mpnet, 2 threads: ~26 ms of CPU per 12-piece text in passes of 64,
~33 ms in passes of 8). 0, 32, 128 and 512 were measured on 256 LoCoMo turns (load 10-13): 86, 88, 89 and
104 ms of CPU per turn, against 124 for passes of 64 in character order."""


def length_batches(lengths: list[int], cap: int, overhead: int = BATCH_OVERHEAD_TOKENS) -> list[range]:
    """Cut texts sorted by length (`lengths`: word pieces, ascending) into consecutive passes of at
    most `cap` texts, minimising the padded size Σ (texts × longest) + `overhead` per pass: an exact
    dynamic programme over the cut points, O(len(lengths) · cap). Returns ranges of positions that
    cover 0..len(lengths) in order. Raises ValueError when `cap` < 1 or `lengths` is not ascending."""
    if cap < 1:
        raise ValueError(f"cap must be positive, got {cap}")
    if any(a > b for a, b in zip(lengths, lengths[1:], strict=False)):
        raise ValueError("lengths must be sorted ascending")
    n = len(lengths)
    best = [0] + [0] * n  # best[j]: least cost of the first j texts
    cut = [0] * (n + 1)  # cut[j]: where the last pass of that best cut begins
    for end in range(1, n + 1):
        longest = lengths[end - 1]  # ascending: the last text of a pass is its longest
        start = max(0, end - cap)
        best[end] = best[start] + (end - start) * longest + overhead
        cut[end] = start
        for begin in range(start + 1, end):
            cost = best[begin] + (end - begin) * longest + overhead
            if cost < best[end]:
                best[end], cut[end] = cost, begin
    parts = []
    end = n
    while end:
        parts.append(range(cut[end], end))
        end = cut[end]
    return parts[::-1]


def _pad_token(model_dir: Path) -> str:
    config = json.loads((model_dir / "special_tokens_map.json").read_text(encoding="utf-8"))
    pad = config.get("pad_token", "[PAD]")
    return str(pad["content"] if isinstance(pad, dict) else pad)


def check_mean_pooling(model_dir: Path) -> str | None:
    """None when the model is Transformer → mean Pooling (→ Normalize), the shape this backend computes;
    else why not (the reason is logged and torch runs)."""
    try:
        modules = json.loads((model_dir / "modules.json").read_text(encoding="utf-8"))
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        pooling_dir = next(model_dir / m["path"] for m in modules if m["type"].endswith("Pooling"))
        pooling = json.loads((pooling_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, StopIteration) as exc:
        return f"cannot read the model's modules ({type(exc).__name__}: {exc})"
    if kinds[:2] != ["Transformer", "Pooling"] or not set(kinds[2:]) <= {"Normalize"}:
        return f"modules {kinds} are not Transformer, Pooling[, Normalize]"
    modes = [k for k, v in pooling.items() if k.startswith("pooling_mode") and v]
    if modes != ["pooling_mode_mean_tokens"]:
        return f"pooling {modes} is not mean pooling"
    return None


def _Hidden(transformer: Any) -> Any:
    """The Hugging Face model as (input_ids, attention_mask) → last_hidden_state, by keyword: models
    differ in the order of their positional arguments."""
    import torch

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = transformer

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return Hidden()


def fingerprint(model_dir: Path) -> str:
    """What the export depends on: the model files' names and sizes, the recipe, onnxruntime's version."""
    import onnxruntime as ort

    digest = hashlib.blake2b(f"{RECIPE}|{ort.__version__}".encode(), digest_size=12)
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        digest.update(f"|{path.relative_to(model_dir)}:{path.stat().st_size}".encode())
    return digest.hexdigest()


def export(model_dir: Path, target: Path, *, threads: int) -> dict[str, Any]:
    """Export, quantise and gate the model at `model_dir` into `target` (a directory created here,
    atomically) → the manifest. The caller holds the export lock. Needs torch, sentence-transformers
    and onnx; raises what they raise (ImportError, OSError, RuntimeError) on failure."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from sentence_transformers import SentenceTransformer

    started = time.monotonic()

    def step(i: int, what: str) -> None:  # a line per step: the whole export takes 15-60 s
        log.info("%s ◆ ONNX export %d/4 at %.0fs: %s", target.name, i, time.monotonic() - started, what)

    torch.set_num_threads(threads)
    step(1, "reference vectors with torch")
    model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    max_len = int(model.max_seq_length or model.tokenizer.model_max_length)
    texts, queries = list(AGREEMENT_TEXTS), list(QUERY_AGREEMENT_TEXTS)
    reference, query_reference = (
        model.encode(
            t, batch_size=16, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        for t in (texts, queries)
    )
    transformer = _Hidden(cast(Any, model[0]).auto_model.eval())
    sample = model.tokenizer(["a b", "a longer sample text"], padding=True, return_tensors="pt")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    work.chmod(0o755)  # mkdtemp makes it private; the cache is shared by every process and user
    try:
        axes = {0: "batch", 1: "tokens"}
        step(2, "tracing the graph")
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
            torch.onnx.export(
                transformer,
                (sample["input_ids"], sample["attention_mask"]),
                str(work / FILES["onnx"]),
                input_names=["input_ids", "attention_mask"],
                output_names=["last_hidden_state"],
                dynamic_axes={"input_ids": axes, "attention_mask": axes, "last_hidden_state": axes},
                opset_version=17,
                dynamo=False,
            )
        import onnx

        graph = onnx.load(str(work / FILES["onnx"]), load_external_data=False)
        keep_float = [
            n.name
            for n in graph.graph.node
            if n.op_type == "MatMul" and "/output/dense/" in n.name and "attention" not in n.name
        ]
        del graph
        step(3, "the int8 copy")
        quiet = logging.getLogger().level
        logging.getLogger().setLevel(logging.ERROR)  # the quantiser logs a line per tensor, and advice
        try:
            quantize_dynamic(
                str(work / FILES["onnx"]),
                str(work / FILES["onnx-int8"]),
                weight_type=QuantType.QInt8,
                per_channel=True,
                nodes_to_exclude=keep_float,
                extra_options={"MatMulConstBOnly": True},
            )
        finally:
            logging.getLogger().setLevel(quiet)
        manifest: dict[str, Any] = {"fingerprint": fingerprint(model_dir), "max_seq_length": max_len}
        step(4, "checking both graphs against torch")
        for variant, file in FILES.items():
            onnx_model = OnnxSentenceModel(
                work / file, model_dir, max_seq_length=max_len, threads=threads, variant=variant
            )
            agreed = agreement(reference, onnx_model.encode_counted(texts, 16)[0])
            asked = agreement(query_reference, onnx_model.encode_counted(queries, 16)[0])
            manifest[variant] = {
                "mean": agreed.mean,
                "min": agreed.min,
                "n": agreed.n,
                "query": {"mean": asked.mean, "min": asked.min, "n": asked.n},
            }
        manifest["export_seconds"] = round(time.monotonic() - started, 1)
        (work / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        os.replace(work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return manifest


def ensure_export(
    model_dir: Path, cache_dir: Path, name: str, *, threads: int
) -> tuple[Path, dict[str, Any]]:
    """The export directory of `name` and its manifest, exporting first when it is missing or stale.
    A current export is read without the lock, so a read-only cache (an image's, exported at build) works.
    Otherwise one process exports at a time (file lock, waits up to 15 minutes) and the others then read
    its result. Raises what `export` raises, filelock.Timeout, and OSError for an unwritable cache."""
    target = cache_dir / f"{name}-onnx"
    want = fingerprint(model_dir)
    manifest = _current_manifest(target, want)
    if manifest is not None:
        return target, manifest
    cache_dir.mkdir(parents=True, exist_ok=True)
    lock = str(cache_dir / f"{name}-onnx.lock")
    waiting = f"{name} ◆ another process is exporting the model to ONNX; waiting for it"
    with held(lock, waiting, timeout=900):
        manifest = _current_manifest(target, want)  # another process may have exported while we waited
        if manifest is not None:
            return target, manifest
        log.info("%s ◆ exporting to ONNX once for every process (torch → onnx → int8) ◆ %s", name, target)
        manifest = export(model_dir, target, threads=threads)
        log.info(
            "%s ◆ ONNX export done in %.0fs ◆ agreement with torch (mean cosine): float %.4f, int8 %.4f, "
            "int8 on queries %.4f",
            name,
            manifest["export_seconds"],
            manifest["onnx"]["mean"],
            manifest["onnx-int8"]["mean"],
            manifest["onnx-int8"]["query"]["mean"],
        )
        return target, manifest


def _current_manifest(target: Path, fingerprint: str) -> dict[str, Any] | None:
    try:
        manifest = json.loads((target / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("fingerprint") != fingerprint:
        return None
    window = manifest.get("max_seq_length")  # damaged by hand: export again rather than fail every start
    return manifest if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None
