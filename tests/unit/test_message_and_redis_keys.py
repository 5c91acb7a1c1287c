"""What the plans give out for sealed messages and Redis's password (cluster/plan.py, cluster/redis_auth.py):
only mqproxy and tinker hold the message key; Redis wants a password that only the access nodes' URL carries,
the same in every render of a spec, and never in the URL `cluster status` shows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from blobstore_server.cluster.plan import ClusterPlan, ClusterShape, plan_cluster, plan_spec
from blobstore_server.cluster.redis_auth import REDIS_USER, redacted, redis_password, with_credentials
from blobstore_server.cluster.spec import load
from blobstore_server.libs.mq.seal import message_key
from blobstore_server.libs.rpc.auth import new_secret
from blobstore_server.services.access.config import AccessConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "cluster.example.toml"


def _configs(plan: ClusterPlan, role: str) -> list[dict[str, Any]]:
    return [json.loads(p.config_text) for p in plan.of_role(role)]


def test_only_mqproxy_and_tinker_get_the_message_key(tmp_path: Path) -> None:
    secret = new_secret()
    plan = plan_cluster(tmp_path, ClusterShape(), iter(range(20000, 21000)), "python", "location-secret", secret)
    holders = {p.role for p in plan.processes if p.role not in ("redis", "kafka")
               and "message_key" in json.loads(p.config_text)}
    assert holders == {"mqproxy", "tinker"}
    for role in holders:
        assert {c["message_key"] for c in _configs(plan, role)} == {message_key(secret).hex()}


def test_redis_wants_a_password_that_only_the_access_nodes_url_carries(tmp_path: Path) -> None:
    secret = new_secret()
    plan = plan_cluster(tmp_path, ClusterShape(), iter(range(20000, 21000)), "python", "location-secret", secret)
    (redis,) = plan.of_role("redis")
    password = redis_password(secret)
    assert "user default off" in redis.config_text and f"user {REDIS_USER} on #" in redis.config_text
    assert password not in redis.config_text  # only its hash
    assert password not in redis.url  # the URL in cluster.json and `cluster status`
    for config in _configs(plan, "access"):
        assert AccessConfig.model_validate(config).redis_url == with_credentials(redis.url, secret)
        assert f"{REDIS_USER}:{password}@" in config["redis_url"]
    others = [p for p in plan.processes if p.role not in ("access", "redis")]
    assert not any(password in p.config_text for p in others)


def test_every_render_of_a_spec_gives_redis_the_same_password() -> None:
    spec, secret = load(EXAMPLE), new_secret()
    first, again = plan_spec(spec, "python", secret), plan_spec(spec, "python", secret)
    assert [p.config_text for p in first.of_role("redis")] == [p.config_text for p in again.of_role("redis")]
    assert {c["redis_url"] for c in _configs(first, "access")} == {c["redis_url"] for c in _configs(again, "access")}
    assert redis_password(secret) in _configs(first, "access")[0]["redis_url"]
    assert redis_password(new_secret()) != redis_password(secret)


def test_a_url_is_shown_without_its_password() -> None:
    url = with_credentials("redis://10.0.0.1:6379/0", new_secret())
    assert redacted(url) == f"redis://{REDIS_USER}:***@10.0.0.1:6379/0"
    assert redacted("redis://10.0.0.1:6379/0") == "redis://10.0.0.1:6379/0"
    assert with_credentials(url, "00" * 32).count("@") == 1  # a URL with credentials gets them replaced
