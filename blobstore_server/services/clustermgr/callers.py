"""What a caller may ask of clustermgr beyond its route's capability: decided here, without I/O, before anything
is proposed (so a refusal changes nothing).

- `/scope/alloc` hands out bids only, at most `SCOPE_LIMITS` per request: vids and disk ids are clustermgr's own
  (it takes them as it creates a volume or answers `/disk/alloc_id`), and a count that could run a scope out (a
  vid count of 2^32) would stop every later volume creation for good.
- A volume lease's holder is the allocator that signed the request (its identity, its advertised host), never a
  name in the body it could make up: one allocator cannot release, renew or reclaim another's leases. The operator
  (who holds every key) may act for any holder; without auth (a single-machine dev cluster) the body names it.
- A disk leaves `repairing` for `repaired`, or `dropping` for `dropped`, only once no volume unit is left on it:
  whoever holds `disk-status` cannot make clustermgr forget a disk whose shards are still the only copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from blobstore_server.libs.proto.cluster import DiskStatus
from blobstore_server.libs.rpc.auth import OPERATOR
from blobstore_server.libs.rpc.errors import BadRequest, Conflict, Forbidden

# The most ids of a scope one `/scope/alloc` takes. Allocators ask for `bid_batch` (10,000) or one object's blobs
# (at most 5 GiB / 64 KiB = 81,920): 2^20 leaves room, and 2^64 bids last 2^44 such requests.
SCOPE_LIMITS: Mapping[str, int] = MappingProxyType({"bid": 1 << 20})
EMPTIED = frozenset({DiskStatus.REPAIRED, DiskStatus.DROPPED})  # a disk reaches these only once it holds no unit


def check_scope_request(name: str, count: int) -> None:
    """BadRequest unless `count` ids of scope `name` may be handed out to a caller at once."""
    limit = SCOPE_LIMITS.get(name)
    if limit is None:
        raise BadRequest(f"scope {name!r} is not handed out by /scope/alloc (only {', '.join(SCOPE_LIMITS)}): "
                         f"clustermgr takes its own vids and disk ids")
    if count > limit:
        raise BadRequest(f"at most {limit} ids of scope {name!r} per request, not {count}")


def check_holder(signer: str | None, holder: str) -> None:
    """Forbidden unless a lease request's `signer` is its `holder`, the operator, or unknown (no auth)."""
    if signer is not None and signer not in (OPERATOR, holder):
        raise Forbidden(f"{signer} holds leases under its own name only, not as {holder!r}")


def check_disk_move(disk_id: int, current: DiskStatus, wanted: DiskStatus | None, units_left: int) -> None:
    """Conflict when `wanted` would declare a disk emptied while `units_left` volume units still live on it (the
    transition table itself is the command's to check)."""
    if wanted in EMPTIED and wanted is not current and units_left:
        raise Conflict(f"disk {disk_id} still holds {units_left} volume units: it cannot be {wanted} yet")
