"""OpenAI embeddings (``POST /v1/embeddings``) behind the ``Embedder`` interface."""

from __future__ import annotations

from collections.abc import Sequence

import openai

from core.models.adapters.openai_responses import convert_openai_error

PROVIDER = "openai"


class OpenAIEmbedder:
    def __init__(
        self,
        *,
        api_key: str,
        model: str = "text-embedding-3-small",
        base_url: str | None = None,
        dimensions: int | None = None,
        timeout: float = 30.0,
    ) -> None:
        self._client = openai.AsyncOpenAI(api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout)
        self._model = model
        self._dimensions = dimensions
        self.model_id = f"openai:{model}" + (f":{dimensions}" if dimensions else "")
        self.dimensions = dimensions or (3072 if model.endswith("-large") else 1536)

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        try:
            if self._dimensions:
                result = await self._client.embeddings.create(
                    model=self._model, input=list(texts), dimensions=self._dimensions
                )
            else:
                result = await self._client.embeddings.create(model=self._model, input=list(texts))
        except openai.OpenAIError as exc:
            error = convert_openai_error(exc, PROVIDER)
            if error is None:
                raise
            raise error from exc
        return [list(item.embedding) for item in sorted(result.data, key=lambda d: d.index)]

    async def aclose(self) -> None:
        await self._client.close()
