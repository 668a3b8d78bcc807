"""Pluggable payload serializers. JSON (through pydantic) is the default."""

from __future__ import annotations

from typing import Protocol, TypeVar

from pydantic import ValidationError

from bus.errors import PayloadError
from bus.messages import Message

M = TypeVar("M", bound=Message)


class Serializer(Protocol):
    """Turns message contracts into bytes and back.

    ``content_type`` travels in the envelope. ``text`` says whether the bytes are UTF-8 text
    (carried as a string in the envelope) or binary (carried base64-encoded).
    """

    content_type: str
    text: bool

    def dumps(self, message: Message) -> bytes: ...

    def loads(self, data: bytes, contract: type[M]) -> M:
        """Raises PayloadError with a human-readable reason."""
        ...


class JsonSerializer:
    content_type = "application/json"
    text = True

    def dumps(self, message: Message) -> bytes:
        return message.model_dump_json().encode("utf-8")

    def loads(self, data: bytes, contract: type[M]) -> M:
        try:
            return contract.model_validate_json(data)
        except ValidationError as exc:
            # Fields and rules only: the values may be a decrypted payload's (a card number),
            # and the reason goes to the poison queue, the log and the dashboard.
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}"
                                 for e in exc.errors(include_input=False, include_url=False))
            raise PayloadError(f"{contract.message_type} failed validation: {problems}") from None
