"""What signing costs on the shard path: one blobnode checking signatures and one not, driven alike.

Starts two blobnodes (fsync on), one with `auth` (every request signed by the client and checked before
the route) and one without, then alternates rounds of `--concurrency` concurrent shard puts and gets of
`--size` bytes on each, so drift on this shared box hits both alike. Reports ops/s with signing over
ops/s without: the median over rounds of each round's pair (best rounds shown too). Writes JSON and prints one
summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import drive, summarize
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.rpc import auth
from blobstore_server.libs.rpc.auth import AuthConfig, Signer, new_secret
from blobstore_server.libs.rpc.routes import Capability
from blobstore_server.services.blobnode.client import BlobnodeClient
from tests.support.processes import Service, free_port


def start_blobnode(root: Path, name: str, keys: AuthConfig | None) -> Service:
    port = free_port()
    workdir = root / name
    workdir.mkdir()
    config: dict[str, object] = {"bind_addr": f"127.0.0.1:{port}", "disks": [{"path": str(workdir / "d"),
                                                                              "disk_id": 1}]}
    if keys is not None:
        config["auth"] = keys.model_dump(mode="json")
    return Service("blobnode", config, workdir, f"http://127.0.0.1:{port}", insecure=keys is None).start()


async def one_round(url: str, signer: Signer | None, vuid: int, size: int, count: int, concurrency: int,
                    first_bid: int) -> dict[str, dict[str, float]]:
    auth.install(signer)
    data = os.urandom(size)
    async with BlobnodeClient() as client:
        put = await drive(count, concurrency, lambda i: client.put_shard(url, 1, vuid, first_bid + i, data))
        get = await drive(count, concurrency, lambda i: client.get_shard(url, 1, vuid, first_bid + i))
    return {"put": summarize(*put, size), "get": summarize(*get, size)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=4 << 10)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--out", default="bench/results/signing.json")
    args = parser.parse_args()
    secret = new_secret()
    keys = AuthConfig.for_capabilities(secret, [Capability.READ_SHARD, Capability.WRITE_SHARD, Capability.CHUNK])
    signer = Signer(keys.keys)
    vuid = Vuid.make(1, 0, 1)
    rounds: dict[str, list[dict[str, dict[str, float]]]] = {"signed": [], "unsigned": []}
    with tempfile.TemporaryDirectory(prefix="bench-signing-") as tmp:
        nodes = {"signed": start_blobnode(Path(tmp), "signed", keys),
                 "unsigned": start_blobnode(Path(tmp), "unsigned", None)}
        try:
            for kind, node in nodes.items():
                auth.install(signer if kind == "signed" else None)
                asyncio.run(_create(node.url, vuid))
            for r in range(args.rounds):
                for kind, node in nodes.items():
                    run = functools.partial(one_round, node.url, signer if kind == "signed" else None, vuid,
                                            args.size, args.count, args.concurrency, r * args.count)
                    rounds[kind].append(asyncio.run(run()))
        finally:
            for node in nodes.values():
                node.stop()
    best = {kind: {op: max((r[op] for r in runs), key=lambda s: s["ops_per_s"]) for op in ("put", "get")}
            for kind, runs in rounds.items()}
    # each round's signed run over the unsigned run right after it: drift on this shared box hits both of a pair
    ratio = {op: round(statistics.median(s[op]["ops_per_s"] / u[op]["ops_per_s"]
                                         for s, u in zip(rounds["signed"], rounds["unsigned"], strict=True)), 2)
             for op in ("put", "get")}
    result = {"size": args.size, "concurrency": args.concurrency, "rounds": rounds, "best": best,
              "signed_over_unsigned": ratio}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"signing on the shard path ({args.size >> 10} KiB, c={args.concurrency}, fsync): put "
          f"{best['signed']['put']['ops_per_s']:.0f}/s signed vs {best['unsigned']['put']['ops_per_s']:.0f}/s "
          f"unsigned = {ratio['put']:.2f}x; get {best['signed']['get']['ops_per_s']:.0f}/s vs "
          f"{best['unsigned']['get']['ops_per_s']:.0f}/s = {ratio['get']:.2f}x")


async def _create(url: str, vuid: int) -> None:
    async with BlobnodeClient() as client:
        await client.create_chunk(url, 1, vuid)


if __name__ == "__main__":
    main()
