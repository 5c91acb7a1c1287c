"""Typed async client of the blobnode API, used by access, workers, the CLI and the tests.

One client talks to every blobnode (the host is an argument of each call) over one shared
connection pool, because an access PUT fans out to N+M of them at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from libs.rpc.client import ServiceClient


@dataclass(frozen=True)
class ShardInfo:
    bid: int
    vuid: int
    offset: int
    size: int
    crc: int
    status: str

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ShardInfo:
        return cls(raw["bid"], raw["vuid"], raw["offset"], raw["size"], raw["crc"], raw["status"])


class BlobnodeClient(ServiceClient):



    # chunks

    async def create_chunk(self, host: str, disk_id: int, vuid: int, chunk_size: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"disk_id": disk_id, "vuid": vuid}
        if chunk_size is not None:
            body["chunk_size"] = chunk_size
        return await self.http.call("POST", f"{host}/chunk/create", json=body)

    async def _chunk_op(self, host: str, op: str, disk_id: int, vuid: int) -> dict[str, Any]:
        return await self.http.call("POST", f"{host}/chunk/{op}", json={"disk_id": disk_id, "vuid": vuid})

    async def release_chunk(self, host: str, disk_id: int, vuid: int) -> dict[str, Any]:
        return await self._chunk_op(host, "release", disk_id, vuid)

    async def set_chunk_readonly(self, host: str, disk_id: int, vuid: int, readonly: bool = True) -> dict[str, Any]:
        return await self._chunk_op(host, "readonly" if readonly else "readwrite", disk_id, vuid)

    async def compact_chunk(self, host: str, disk_id: int, vuid: int) -> dict[str, Any]:
        return await self._chunk_op(host, "compact", disk_id, vuid)

    async def list_chunks(self, host: str, disk_id: int) -> list[dict[str, Any]]:
        return (await self.http.call("GET", f"{host}/chunk/list", params={"disk_id": disk_id}))["chunks"]

    async def chunk_stat(self, host: str, disk_id: int, vuid: int) -> dict[str, Any]:
        return await self.http.call("GET", f"{host}/chunk/stat", params={"disk_id": disk_id, "vuid": vuid})

    # shards

    async def put_shard(self, host: str, disk_id: int, vuid: int, bid: int,
                        data: bytes | bytearray | memoryview, timeout: float | None = None) -> int:
        """Store one shard; returns its CRC32 once the blobnode holds it durably."""
        params = {"disk_id": disk_id, "vuid": vuid, "bid": bid, "size": len(data)}
        answer = await self.http.call("PUT", f"{host}/shard/put", params=params, data=data, timeout=timeout)
        return int(answer["crc"])

    def _get_params(self, disk_id: int, vuid: int, bid: int, offset: int, size: int | None) -> dict[str, int]:
        params = {"disk_id": disk_id, "vuid": vuid, "bid": bid, "offset": offset}
        if size is not None:
            params["size"] = size
        return params

    async def get_shard(self, host: str, disk_id: int, vuid: int, bid: int, offset: int = 0,
                        size: int | None = None, timeout: float | None = None) -> bytes:
        """Read a shard or a range of it; corrupted bytes come back as `ShardCorrupted`, never data."""
        return await self.http.read(f"{host}/shard/get", params=self._get_params(disk_id, vuid, bid, offset, size),
                                    timeout=timeout)

    def stream_shard(self, host: str, disk_id: int, vuid: int, bid: int, offset: int = 0,
                     size: int | None = None) -> AsyncIterator[bytes]:
        return self.http.stream(f"{host}/shard/get", params=self._get_params(disk_id, vuid, bid, offset, size))

    async def _shard_op(self, host: str, op: str, disk_id: int, vuid: int, bid: int) -> dict[str, Any]:
        return await self.http.call("POST", f"{host}/shard/{op}", json={"disk_id": disk_id, "vuid": vuid, "bid": bid})

    async def mark_delete_shard(self, host: str, disk_id: int, vuid: int, bid: int) -> dict[str, Any]:
        return await self._shard_op(host, "markdelete", disk_id, vuid, bid)

    async def unmark_delete_shard(self, host: str, disk_id: int, vuid: int, bid: int) -> dict[str, Any]:
        return await self._shard_op(host, "unmarkdelete", disk_id, vuid, bid)

    async def delete_shard(self, host: str, disk_id: int, vuid: int, bid: int) -> dict[str, Any]:
        return await self._shard_op(host, "delete", disk_id, vuid, bid)

    async def shard_stat(self, host: str, disk_id: int, vuid: int, bid: int) -> ShardInfo:
        raw = await self.http.call("GET", f"{host}/shard/stat", params={"disk_id": disk_id, "vuid": vuid, "bid": bid})
        return ShardInfo.from_json(raw)

    async def list_shards(self, host: str, disk_id: int, vuid: int, start_bid: int = 0, count: int | None = None,
                          status: str | None = None) -> list[ShardInfo]:
        params: dict[str, Any] = {"disk_id": disk_id, "vuid": vuid, "start_bid": start_bid}
        if count is not None:
            params["count"] = count
        if status is not None:
            params["status"] = status
        raw = await self.http.call("GET", f"{host}/shard/list", params=params)
        return [ShardInfo.from_json(s) for s in raw["shards"]]

    # node

    async def disk_stat(self, host: str, disk_id: int) -> dict[str, Any]:
        return await self.http.call("GET", f"{host}/disk/stat", params={"disk_id": disk_id})

    async def stat(self, host: str) -> dict[str, Any]:
        return await self.http.call("GET", f"{host}/stat")

    async def health(self, host: str, timeout: float = 2.0) -> bool:
        try:
            await self.http.call("GET", f"{host}/health", timeout=timeout)
        except Exception:
            return False
        return True
