"""Service configuration: a JSON file validated by a pydantic model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

Model = TypeVar("Model", bound=BaseModel)


class ConfigError(Exception):
    """The config file is missing, not JSON, or fails validation."""


def load_config(path: str | Path, model: type[Model]) -> Model:
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid JSON: {exc}") from None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"config file {path} is invalid:\n{exc}") from None
