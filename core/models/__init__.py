"""One door for every model call: types, errors, adapters per provider, and the router.

Vendor SDKs are imported only in ``core/models/adapters/``; everything else speaks the types
in ``core.models.types``.
"""

from core.models.errors import (
    ModelAuthError,
    ModelError,
    ModelNotConfigured,
    ModelRequestError,
    ModelTransientError,
    StreamInterrupted,
)
from core.models.types import (
    ChatMessage,
    Generation,
    ModelService,
    Prompt,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolResult,
    ToolSpec,
    Usage,
)

__all__ = [
    "ChatMessage",
    "Generation",
    "ModelAuthError",
    "ModelError",
    "ModelNotConfigured",
    "ModelRequestError",
    "ModelService",
    "ModelTransientError",
    "Prompt",
    "StreamEvent",
    "StreamInterrupted",
    "TextDelta",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
    "Usage",
]
