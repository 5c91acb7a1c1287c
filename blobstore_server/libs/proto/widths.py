"""Fixed-width integers as the wire formats bound them: the largest value of each, and the pydantic field that
refuses anything outside it."""

from __future__ import annotations

from pydantic import Field

U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1
U32 = Field(ge=0, le=U32_MAX)
U64 = Field(ge=0, le=U64_MAX)
