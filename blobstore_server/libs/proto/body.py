"""The base of every request body a route takes: a field the service does not know is refused (400), not
silently dropped, so a misspelt option never reads as accepted."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class RequestBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
