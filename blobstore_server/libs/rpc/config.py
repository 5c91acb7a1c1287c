"""Service configuration: a JSON file validated by a pydantic model."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, Field, ValidationError

from blobstore_server.libs.rpc.auth import AuthConfig
from blobstore_server.libs.rpc.limits import Limits

Model = TypeVar("Model", bound=BaseModel)


class TLSConfig(BaseModel):
    """HTTPS for a service's listener (its certificate and key), and the CA its clients trust for peers."""

    cert_file: str
    key_file: str
    ca_file: str | None = None


class ServiceSettings(BaseModel):
    """What every service's config has: signing keys (with `auth` set, the service signs what it sends and
    checks what it serves, if its API is public only its declared routes), per-request limits, and optional TLS.
    A service without `auth` refuses to start unless `insecure` is true, so running every route open is never an
    accident; nor does one with `auth` whose other links are open (`open_links`: an unsigned Raft port, unsealed
    or unauthenticated Kafka) unless `insecure` says so."""

    auth: AuthConfig | None = None
    insecure: bool = False  # no auth on purpose: every route open, nothing signed (logged, shown in /health)
    limits: Limits = Field(default_factory=Limits)
    tls: TLSConfig | None = None  # set `host` to the https:// URL others reach the service at
    # The longest a thread keeps the GIL while another waits for it (Python's default: 5 ms). The event loop
    # serving requests waits up to this for a disk, codec or repair thread: at 0.5 ms, user p99 during a disk
    # rebuild fell from a median 2.1x / 3.5x (PUT / GET) of baseline to 1.5x / 2.2x (bench/repair.py, 6
    # alternated pairs), with no measurable CPU cost per operation (bench/access.py, 2 pairs).
    gil_switch_ms: float = Field(0.5, gt=0, le=100)

    @property
    def scheme(self) -> str:
        """How others reach this service: https once it has a certificate."""
        return "https" if self.tls is not None else "http"

    def open_links(self) -> list[str]:
        """What this config leaves open to anyone on the network besides its HTTP routes (none here)."""
        return []


def auth_problem(settings: ServiceSettings, path: str | Path, role: str) -> str | None:
    """Why a service must not start with these settings (one line naming the config file), or None."""
    open_links = settings.open_links() if settings.auth is not None else []
    if settings.auth is not None and settings.insecure and not open_links:
        return (f"config file {path} has both `auth` and `\"insecure\": true`; "
                f"remove `insecure` (auth set) or `auth` (open on purpose)")
    if open_links and not settings.insecure:
        return (f"config file {path} leaves open: {'; '.join(open_links)}; close them or add `\"insecure\": true` "
                f"to run so on purpose")
    if settings.auth is None and not settings.insecure:
        return (f"config file {path} has no `auth`: add an `auth` section (`blobstore auth config {role} {path} "
                f"--secret-file SECRET -o OUT` writes one) or `\"insecure\": true` to run every route open, unsigned")
    return None


class ConfigError(Exception):
    """The config file is missing, not JSON, or fails validation."""


def load_config(path: str | Path, model: type[Model]) -> Model:
    """The config in `path`; ConfigError naming the file when it is missing, not JSON, invalid, or has a key its
    model does not know (a typo would otherwise leave a setting at its default without a word)."""
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid JSON: {exc}") from None
    try:
        config = model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"config file {path} is invalid:\n{exc}") from None
    unknown = unknown_keys(raw, config)
    if unknown:
        raise ConfigError(f"config file {path} has unknown keys: {'; '.join(unknown)}")
    return config


def unknown_keys(raw: object, value: object, where: str = "") -> list[str]:
    """Keys of `raw` that validating it into `value` ignored, each with its place and a close known name."""
    if isinstance(value, BaseModel) and isinstance(raw, dict):
        if type(value).model_config.get("extra") == "allow":
            return []
        names = {key: name for name, field in type(value).model_fields.items() for key in {name, field.alias or name}}
        found = []
        for key, item in raw.items():
            place = f"{where}.{key}" if where else str(key)
            if key in names:
                found += unknown_keys(item, getattr(value, names[key]), place)
                continue
            close = difflib.get_close_matches(str(key), list(names), n=1)
            found.append(f"`{place}`" + (f" (did you mean `{close[0]}`?)" if close else ""))
        return found
    if isinstance(value, list | tuple) and isinstance(raw, list):
        return [found for i, (r, v) in enumerate(zip(raw, value, strict=False))
                for found in unknown_keys(r, v, f"{where}[{i}]")]
    if isinstance(value, dict) and isinstance(raw, dict):
        return [found for k, v in value.items() if str(k) in raw
                for found in unknown_keys(raw[str(k)], v, f"{where}.{k}")]
    return []
