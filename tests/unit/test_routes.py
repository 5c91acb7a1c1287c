"""Route declarations (libs/rpc/routes.py): a service's handler must take and answer what its declaration names,
and a client call must send what it declares; both are refused before anything is served or sent."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from blobstore_server.libs.rpc.client import HttpClient
from blobstore_server.libs.rpc.routes import Capability, Route
from blobstore_server.libs.rpc.server import serves


class Body(BaseModel):
    n: int


class Answer(BaseModel):
    n: int


class Other(BaseModel):
    n: int


ROUTE = Route("POST", "/thing", Capability.OBSERVE, Answer, Body)


async def declared(req: Body) -> Answer:
    return Answer(n=req.n)


async def answers_other(req: Body) -> Other:
    return Other(n=req.n)


async def takes_other(req: Other) -> Answer:
    return Answer(n=req.n)


async def takes_nothing() -> Answer:
    return Answer(n=0)


def test_a_handler_is_served_only_as_its_route_declares() -> None:
    app = FastAPI()
    serves(app, ROUTE)(declared)
    assert [(r.path, r.methods) for r in app.routes if getattr(r, "path", "") == "/thing"] == [("/thing", {"POST"})]
    for wrong in (answers_other, takes_other, takes_nothing):
        with pytest.raises(TypeError, match="/thing"):
            serves(FastAPI(), ROUTE)(wrong)


def test_a_client_sends_only_the_body_a_route_declares() -> None:
    async def call(body: BaseModel | None) -> None:
        async with HttpClient() as http:
            await http.call_route(ROUTE, "http://127.0.0.1:9", body=body)

    for wrong in (Other(n=1), None):
        with pytest.raises(TypeError, match="/thing"):
            asyncio.run(call(wrong))
