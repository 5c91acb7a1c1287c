"""Service configuration: a JSON file validated by a pydantic model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, Field, ValidationError

from libs.rpc.auth import AuthConfig
from libs.rpc.limits import Limits

Model = TypeVar("Model", bound=BaseModel)


class TLSConfig(BaseModel):
    """HTTPS for a service's listener (its certificate and key), and the CA its clients trust for peers."""

    cert_file: str
    key_file: str
    ca_file: str | None = None


class ServiceSettings(BaseModel):
    """What every service's config has: signing keys (with `auth` set, the service signs what it sends and,
    unless its API is public, checks what it serves), per-request limits, and optional TLS. A service without
    `auth` refuses to start unless `insecure` is true, so running every route open is never an accident."""

    auth: AuthConfig | None = None
    insecure: bool = False  # no auth on purpose: every route open, nothing signed (logged, shown in /health)
    limits: Limits = Field(default_factory=Limits)
    tls: TLSConfig | None = None  # set `host` to the https:// URL others reach the service at


def auth_problem(settings: ServiceSettings, path: str | Path, role: str) -> str | None:
    """Why a service must not start with these settings (one line naming the config file), or None."""
    if settings.auth is not None and settings.insecure:
        return (f"config file {path} has both `auth` and `\"insecure\": true`; "
                f"remove `insecure` (auth set) or `auth` (open on purpose)")
    if settings.auth is None and not settings.insecure:
        return (f"config file {path} has no `auth`: add an `auth` section (`blobstore auth config {role} {path} "
                f"--secret-file SECRET -o OUT` writes one) or `\"insecure\": true` to run every route open, unsigned")
    return None


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
