"""Embeddings: the local ONNX model on this machine, and OpenAI's through its loopback peer."""

from __future__ import annotations

import math

import pytest

from core.models import ModelNotConfigured, ModelTransientError
from core.models.adapters.openai_embeddings import OpenAIEmbedder
from core.models.embeddings import LocalEmbedder, embedder_from_settings
from core.settings import Settings
from core.testing.peers import OpenAIPeer, fake_embedding, fault


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def local() -> LocalEmbedder:
    return LocalEmbedder()


async def test_local_embeddings_are_unit_vectors_that_rank_meaning(local: LocalEmbedder) -> None:
    texts = ["The cat sat on the mat.", "A kitten is sitting on a rug.", "Quarterly tax filing deadline"]
    cat, kitten, tax = await local.embed(texts)
    assert len(cat) == local.dimensions == 384
    assert math.isclose(math.sqrt(cosine(cat, cat)), 1.0, abs_tol=1e-4)
    assert cosine(cat, kitten) > cosine(cat, tax) + 0.2
    # Padding in a batch does not change a text's vector.
    (alone,) = await local.embed([texts[0]])
    assert cosine(alone, cat) > 0.9999
    assert await local.embed([]) == []


def test_local_is_the_default_embedder() -> None:
    assert isinstance(embedder_from_settings(Settings()), LocalEmbedder)


def test_provider_embeddings_need_their_key() -> None:
    with pytest.raises(ModelNotConfigured, match="OPENAI_API_KEY"):
        embedder_from_settings(Settings(models={"embeddings": "text-embedding-3-small"}))


async def test_openai_embeddings_through_the_peer() -> None:
    async with OpenAIPeer(embedding_dims=32) as peer:
        embedder = embedder_from_settings(
            Settings(openai_api_key="k", openai_base_url=peer.base_url,
                     models={"embeddings": "text-embedding-3-small", "embedding_dimensions": 32})
        )  # fmt: skip
        assert isinstance(embedder, OpenAIEmbedder) and embedder.dimensions == 32
        vectors = await embedder.embed(["alpha", "beta"])
        peer.embedding_faults.append(fault(503))
        with pytest.raises(ModelTransientError):
            await embedder.embed(["gamma"])
        await embedder.aclose()
    assert [round(v, 5) for v in vectors[1]] == [round(v, 5) for v in fake_embedding("beta", 32)]
    assert peer.requests[0].body["dimensions"] == 32 and peer.requests[0].body["model"] == "text-embedding-3-small"
