"""The one internal conversation type every source format is mapped to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


@dataclass
class Message:
    """One turn. `reasoning_content` is a thinking model's hidden reasoning, when known."""

    role: str
    content: str
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    def to_openai(self) -> dict[str, Any]:
        """The message as an OpenAI / chat-template dict (optional keys only when set)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


@dataclass
class Conversation:
    """A sample: a stable id, its messages in order, and optional tool definitions."""

    id: str
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """SpecForge-style record: ``{"id", "conversations": [{"role", "content", ...}]}``."""
        out: dict[str, Any] = {"id": self.id, "conversations": [m.to_openai() for m in self.messages]}
        if self.tools:
            out["tools"] = self.tools
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Conversation:
        """Inverse of `to_json` (trusted input written by eyas itself)."""
        return cls(
            id=str(obj["id"]),
            messages=[
                Message(
                    role=m["role"],
                    content=m.get("content") or "",
                    reasoning_content=m.get("reasoning_content"),
                    tool_calls=m.get("tool_calls"),
                )
                for m in obj["conversations"]
            ],
            tools=obj.get("tools"),
        )
