"""A disk's scheduler epoch rises only to an epoch clustermgr tickets, the one its lease record holds (issue 65: the
scheduler's key alone could raise a disk's epoch past any a scheduler would ever win, fencing every later
scheduler out there for good), on real processes with a running scheduler."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from blobstore_server.cluster.service_auth import role_auth
from blobstore_server.libs.proto.blobnode import ChunkStatus
from blobstore_server.libs.proto.scheduler import LEADER_KEY, LeaderRecord
from blobstore_server.libs.rpc import errors, tickets
from blobstore_server.libs.rpc.tickets import Kind
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from tests.support.processes import TEST_SECRET, signing_with
from tests.support.tickets import epoch_ticket, hmac_keys, minter
from tests.support.waiting import eventually


def test_only_the_lease_records_epoch_raises_a_disks_scheduler_epoch(cluster_factory: Any) -> None:
    cluster = cluster_factory(blobnodes=7, min_volumes=1, schedulers=1)
    urls = [cm.url for cm in cluster.clustermgr]
    scheduler = hmac_keys(role_auth(TEST_SECRET, "scheduler", {"bind_addr": "127.0.0.1:2"}))  # a leaked conf.json
    own = minter(TEST_SECRET, Kind.DISCARD)  # the ticket key the scheduler holds (discards)

    async def scenario() -> None:
        async with ClusterClient(urls) as cm, BlobnodeClient() as bn:
            async def held() -> LeaderRecord | None:
                raw = await cm.kv_get(LEADER_KEY)
                return LeaderRecord.model_validate_json(raw) if raw else None

            record = await eventually(held, 30, "the scheduler holding its lease")
            unit = (await cm.list_volumes())[0].units[0]
            seen = (await bn.disk_stat(unit.host, unit.disk_id)).scheduler_epoch
            leap = record.epoch + 1000
            forged = own.mint(tickets.cluster_host(1), 0, 0, leap)
            with signing_with(scheduler):
                for ticket, why in ((None, "takes an epoch ticket from clustermgr"),
                                    (forged, "not clustermgr's"),
                                    (epoch_ticket(leap, "ab" * 32), "not clustermgr's"),  # another cluster's secret
                                    (epoch_ticket(leap, cluster_id=2), "not clustermgr's"),  # another cluster's
                                    (await cm.epoch_ticket(record.epoch), "not clustermgr's")):  # the current one's
                    with pytest.raises(errors.TicketRefused, match=why):
                        await bn.set_chunk_readonly(unit.host, unit.disk_id, unit.vuid, scheduler_epoch=leap,
                                                    epoch_ticket=ticket)
                # clustermgr tickets only the epoch its lease record holds, and the record takes no leap
                with pytest.raises(errors.Conflict, match="never won"):
                    await cm.epoch_ticket(leap)
                leapt = LeaderRecord(host="thief", term=record.term + 1, epoch=leap).model_dump_json()
                with pytest.raises(errors.Conflict, match="a write may keep it or take the next"):
                    await cm.kv_set(LEADER_KEY, leapt)
                with pytest.raises(errors.BadRequest, match="never deleted"):
                    await cm.kv_delete(LEADER_KEY)
            assert (await bn.disk_stat(unit.host, unit.disk_id)).scheduler_epoch == seen
            chunks = {c.vuid: c.status for c in await bn.list_chunks(unit.host, unit.disk_id)}
            assert chunks[unit.vuid] is ChunkStatus.NORMAL
            now = await held()
            assert now is not None and now.epoch == record.epoch

    asyncio.run(scenario())
