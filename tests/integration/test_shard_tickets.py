"""Destroying or replacing a shard takes the deciding service's ticket (issue 65 items 1 and 6), on real processes.

With each service's own keys in turn (its HMAC capability keys, a ticket or delete intent it forges with them, and
the ticket key it holds if it mints a kind), a discard of a live shard, a mark-delete, a delete for good of a shard
not marked or still held, a discard on another task's destination and an overwrite of a stored shard are all
refused (403 or 409), and every shard stays as it was: a mark or a delete takes both tinker's ticket and access's
intent, so neither tinker's key nor access's alone destroys anything. The deciders' own paths still work: the
scheduler's ticket discards on its task's destination under that hand-out's token, tinker's ticket with access's
intent marks, and deletes a marked shard once the blobnode's own hold has passed; a repair discards a shard only
once its blobnode sees it rotten."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from blobstore import AsyncClient
from blobstore_server.cluster.plan import CAPABILITIES
from blobstore_server.cluster.service_auth import role_auth
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.proto.messages import DeleteIntent
from blobstore_server.libs.rpc import errors, tickets
from blobstore_server.libs.rpc.auth import AuthConfig, Signer
from blobstore_server.libs.rpc.routes import Capability
from blobstore_server.libs.rpc.tickets import IntentSigner, Kind, Minter
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from tests.support.damage import flip_in_chunk, locate
from tests.support.processes import TEST_SECRET, BlobnodeFactory, LocalCluster, signing_with
from tests.support.shards import assert_every_shard_present, blobs_of
from tests.support.tickets import as_tinker, delete_intent, epoch_ticket, minter

LIVE, DEST, OTHER_DEST = Vuid.make(7, 2, 1), Vuid.make(8, 1, 2), Vuid.make(9, 0, 2)
TOKEN = 2  # the hand-out DEST is filled under
CLUSTER = 1  # every test cluster's id
SIGNING = {Kind.DISCARD: Capability.DISCARD_SHARD, Kind.DELETE: Capability.DELETE_SHARD}
Attempt = Callable[[BlobnodeClient], Coroutine[Any, Any, object]]


def leaked(role: str, auth: dict[str, Any] | None = None) -> tuple[Signer, AuthConfig]:
    """What a stolen `role` config signs with, and all it holds."""
    config = AuthConfig.model_validate(auth or role_auth(TEST_SECRET, role, {"bind_addr": "127.0.0.1:1"}))
    return Signer(config.keys), config


def forged(config: AuthConfig, kind: Kind, host: str, disk_id: int, vuid: int, scope: int) -> list[str | None]:
    """Every ticket of `kind` a holder of `config` can make for the call: none, one signed with the HMAC key of
    the route (as an Ed25519 seed), one with the ticket key it holds (a minter's own, of its own kind only)."""
    seeds = [key for key in (config.keys.get(SIGNING[kind]), config.ticket_signing_key) if key]
    return [None, *(Minter(seed, kind).mint(host, disk_id, vuid, scope) for seed in seeds)]


def forged_intents(config: AuthConfig, vid: int, bid: int) -> list[DeleteIntent | None]:
    """Every delete intent for blob vid/bid a holder of `config` can make: none, one signed with the HMAC key of
    the delete routes, one with the ticket key it holds (access's own is the intent key itself)."""
    seeds = [key for key in (config.keys.get(Capability.DELETE_SHARD), config.ticket_signing_key) if key]
    return [None, *(DeleteIntent(vid=vid, bid=bid, signature=IntentSigner(seed, CLUSTER).sign(vid, bid))
                 for seed in seeds)]


def decides(config: AuthConfig, kind: Kind) -> bool:
    """Whether `config` is the minter's of `kind` (whose tickets are its decisions)."""
    return config.ticket_signing_key == tickets.signing_key(TEST_SECRET, kind)


async def refused(attempt: Coroutine[Any, Any, object], why: str) -> str:
    """The refusal of `attempt`, which must be a 403 or a 409: nothing happened."""
    try:
        await attempt
    except (errors.Forbidden, errors.Conflict) as exc:
        return type(exc).__name__
    raise AssertionError(f"{why}: went through")


async def attack(bn: BlobnodeClient, role: str, config: AuthConfig, units: list[Unit], bids: list[int],
                 dest: Unit | None = None) -> set[str]:
    """Every destructive call a holder of `config` can send at the shards `bids` of `units` (and, unless it is the
    scheduler, which hands tasks out, at a task's destination `dest` filled under TOKEN): the refusals seen."""
    seen = set()
    for unit in units:
        host, disk, vuid = unit.host, unit.disk_id, unit.vuid
        # a live unit's task fence never opens (the scheduler's key would then discard under its own ticket)
        seen.add(await refused(bn.set_task_fence(host, disk, vuid, 1, TOKEN + 1, epoch_ticket=epoch_ticket(1)),
                               f"{role} opens {vuid}'s fence"))
        for bid in bids:
            what = f"{role} on {vuid}/{bid}"
            for token in (None, 1, TOKEN):
                for ticket in forged(config, Kind.DISCARD, host, disk, vuid, token or 0):
                    seen.add(await refused(bn.discard_shard(host, disk, vuid, bid, task_token=token, ticket=ticket),
                                           f"{what}: discard under token {token}, ticket {ticket}"))
            for ticket in forged(config, Kind.DELETE, host, disk, vuid, bid):
                for intent in forged_intents(config, Vuid(vuid).vid(), bid):
                    seen.add(await refused(bn.delete_shard(host, disk, vuid, bid, ticket=ticket, intent=intent),
                                           f"{what}: delete, ticket {ticket}, intent {intent}"))
                    seen.add(await refused(bn.mark_delete_shard(host, disk, vuid, bid, ticket=ticket, intent=intent),
                                           f"{what}: mark, ticket {ticket}, intent {intent}"))
            seen.add(await refused(bn.put_shard(host, disk, vuid, bid, b"other bytes"), f"{what}: overwrite"))
    if dest is not None and not decides(config, Kind.DISCARD):
        for ticket in forged(config, Kind.DISCARD, dest.host, dest.disk_id, dest.vuid, TOKEN):
            seen.add(await refused(bn.discard_shard(dest.host, dest.disk_id, dest.vuid, bids[0], task_token=TOKEN,
                                                    ticket=ticket), f"{role}: discard on a task's destination"))
    return seen


def test_no_service_key_destroys_or_replaces_a_shard_on_a_blobnode(blobnode_factory: BlobnodeFactory) -> None:
    node = blobnode_factory("target", disks=1)
    live, dest = Unit(vuid=LIVE, disk_id=1, host=node.url), Unit(vuid=DEST, disk_id=1, host=node.url)
    stored = {bid: os.urandom(3000 + bid) for bid in (1, 2, 3)}

    async def scenario() -> None:
        async with BlobnodeClient() as bn:
            for unit, epoch in ((live, None), (dest, 1)):  # a volume's unit, clustermgr's; a task's, a scheduler's
                await bn.create_chunk(node.url, 1, unit.vuid, scheduler_epoch=epoch,
                                      epoch_ticket=epoch and epoch_ticket(epoch))
                for bid, data in stored.items():
                    await bn.put_shard(node.url, 1, unit.vuid, bid, data)
            await bn.set_task_fence(node.url, 1, DEST, 1, TOKEN, epoch_ticket=epoch_ticket(1))
            # a blob being deleted, its hold (4 h) not over
            await bn.mark_delete_shard(node.url, 1, LIVE, 3, **as_tinker(node.url, 1, LIVE, 3))
            seen = set()
            for role in CAPABILITIES:
                signer, config = leaked(role)
                with signing_with(signer):
                    seen |= await attack(bn, role, config, [live], list(stored), dest)
            # no ticket or intent, a forged one or one's own of another kind (tinker's ticket lacks access's intent,
            # access's intent tinker's ticket: neither reaches the hold or the mark); a key it lacks; a stored bid
            # the scheduler's key opening a live unit's task fence: Conflict
            assert seen == {"TicketRefused", "Forbidden", "ShardExists", "Conflict"}, seen
            for unit in (live, dest):
                for bid, data in stored.items():
                    if unit is live and bid == 3:
                        assert (await bn.shard_stat(node.url, 1, LIVE, 3)).status == "mark_deleted"
                    else:
                        assert await bn.get_shard(node.url, 1, unit.vuid, bid) == data, (unit.vuid, bid)

            # the deciders' own: tinker's ticket marks a blob access's intent names, and no other ...
            with pytest.raises(errors.TicketRefused, match="does not cover"):
                await bn.mark_delete_shard(node.url, 1, LIVE, 1, ticket=as_tinker(node.url, 1, LIVE, 1)["ticket"],
                                           intent=delete_intent(LIVE.vid(), 3))
            # ... and deletes only past the blobnode's hold ...
            with pytest.raises(errors.ShardHeld):
                await bn.delete_shard(node.url, 1, LIVE, 3, ticket=minter(TEST_SECRET, Kind.DELETE).mint(
                    node.url, 1, LIVE, 3), intent=delete_intent(LIVE.vid(), 3))
            # ... the scheduler's discards on its task's destination, under that hand-out's token only ...
            discards = minter(TEST_SECRET, Kind.DISCARD)
            with pytest.raises(errors.TicketRefused):  # the ticket of another destination
                await bn.discard_shard(node.url, 1, DEST, 1, task_token=TOKEN,
                                       ticket=discards.mint(node.url, 1, OTHER_DEST, TOKEN))
            for vuid, token in ((DEST, 1), (LIVE, 1)):  # an earlier hand-out's; one for a unit no task fills
                with pytest.raises(errors.Fenced):
                    await bn.discard_shard(node.url, 1, vuid, 1, task_token=token,
                                           ticket=discards.mint(node.url, 1, vuid, token))
            await bn.discard_shard(node.url, 1, DEST, 1, task_token=TOKEN,
                                   ticket=discards.mint(node.url, 1, DEST, TOKEN))
            with pytest.raises(errors.ShardNotFound):
                await bn.get_shard(node.url, 1, DEST, 1)
            # ... and a repair discards a live unit's shard once it is rotten, and writes the right bytes back
            flip_in_chunk(*await locate(bn, live, 2))
            await bn.discard_shard(node.url, 1, LIVE, 2)
            await bn.put_shard(node.url, 1, LIVE, 2, stored[2])
            assert await bn.get_shard(node.url, 1, LIVE, 2) == stored[2]

    asyncio.run(scenario())


def test_no_leaked_key_of_a_running_cluster_takes_a_shard_of_a_stored_object(shared_cluster: LocalCluster) -> None:
    """The keys in the configs the cluster's processes run with (a blobnode's, access's) and the worker's and
    tinker's, at every shard of every blob of a stored object: each attempt refused, and `blob shards` of the
    object intact."""
    cluster = shared_cluster
    data = os.urandom(20_000)
    holders = {"worker": leaked("worker"), "tinker": leaked("tinker"),
               "access": leaked("access", cluster.access[0].config["auth"]),
               "blobnode": leaked("blobnode", cluster.blobnodes[-1].config["auth"])}

    async def scenario() -> None:
        async with AsyncClient([cluster.access[0].url], timeout=60) as client:
            location = await client.put(data)
        async with ClusterClient([cm.url for cm in cluster.clustermgr]) as cm, BlobnodeClient() as bn:
            for vid, bid in blobs_of(cluster, location):
                units = (await cm.get_volume(vid)).units
                for role, (signer, config) in holders.items():
                    with signing_with(signer):
                        await attack(bn, role, config, units, [bid])
        await assert_every_shard_present(cluster, {location: data})

    asyncio.run(scenario())
