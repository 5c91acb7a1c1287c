from __future__ import annotations

import random
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from blobstore_server.cluster.launcher import ClusterInfo
from blobstore_server.libs import cpugroup
from blobstore_server.libs.rpc import auth
from blobstore_server.libs.rpc.auth import SECRET_ENV, operator_signer
from tests.support.kafka import kafka_broker  # noqa: F401  (a session fixture)
from tests.support.launched import Launch, LaunchedClusters
from tests.support.postgres import postgres_dsn, postgres_server  # noqa: F401  (fixtures)
from tests.support.processes import (
    TEST_SECRET,
    BlobnodeFactory,
    LocalCluster,
    RedisServer,
    Service,
    free_port,
    start_all,
    stop_all,
    wait_until,
)


@pytest.fixture(scope="session", autouse=True)
def idle_cpu_group() -> Iterator[None]:
    """The idle cpu cgroup background processes run in (libs/cpugroup.py): one killed outright leaves it behind."""
    yield
    group = cpugroup.idle_group_beside()
    if group is not None:
        cpugroup.remove_idle_group(group)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules that share a launched cluster (the same `LAUNCH`) run one after the other, from where the first of
    them stands in the usual order (one that stops it last): the cluster starts once and is stopped before any
    other test runs."""
    modules: dict[object, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(getattr(item, "module", None), []).append(item)
    first_of: dict[Launch, object] = {}
    grouped: dict[object, list[object]] = {}
    for module in modules:
        launch = _launch_of(module)
        key = first_of.setdefault(launch, module) if launch is not None else module
        grouped.setdefault(key, []).append(module)
    items[:] = [item for key in grouped for module in sorted(grouped[key], key=_stops_its_cluster)
                for item in modules[module]]


def _stops_its_cluster(module: object) -> bool:
    """A module that ends by stopping its launched cluster (`STOPS_ITS_CLUSTER`) runs last of those sharing it."""
    return bool(getattr(module, "STOPS_ITS_CLUSTER", False))


def _launch_of(module: object) -> Launch | None:
    launch = getattr(module, "LAUNCH", None)
    return launch if isinstance(launch, Launch) else None


@pytest.fixture(scope="session")
def launched_clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaunchedClusters]:
    clusters = LaunchedClusters(tmp_path_factory.mktemp("launched"))
    try:
        yield clusters
    finally:
        clusters.stop()


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, launched_clusters: LaunchedClusters) -> Iterator[ClusterInfo]:
    """The cluster `cluster up` started for the module's `LAUNCH` (tests/support/launched.py), shared with the modules
    of the same LAUNCH; stopped once the last of them is done."""
    launch = _launch_of(request.module)
    assert launch is not None, f"{request.module.__name__} takes the launched `cluster` without naming its LAUNCH"
    try:
        yield launched_clusters.get(launch)
    finally:
        if _launch_of(_next_module(request)) != launch:
            launched_clusters.stop()


def _next_module(request: pytest.FixtureRequest) -> object:
    """The module whose tests run after this module's last test (None at the end)."""
    items = request.session.items
    last = max(i for i, item in enumerate(items) if getattr(item, "module", None) is request.module)
    return getattr(items[last + 1], "module", None) if last + 1 < len(items) else None


@pytest.fixture(scope="session")
def test_secret() -> str:
    """The session's cluster secret: every fixture's service keys derive from it (tests.support.processes)."""
    return TEST_SECRET


@contextmanager
def _signing_as_operator(secret: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    before = auth.installed()
    monkeypatch.setenv(SECRET_ENV, secret)
    auth.install(operator_signer(secret))
    try:
        yield secret
    finally:
        auth.install(before)


@pytest.fixture
def signed_as_operator(test_secret: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """This process signs what it sends as the operator (every capability) with the session's secret, and so does
    the `blobstore` CLI ($BLOBSTORE_SECRET); the signer before is restored after. Per test, not per session: a
    launcher cluster (`cluster up`) installs its own operator signer while it is loaded."""
    with _signing_as_operator(test_secret, monkeypatch) as secret:
        yield secret


def insecure_fixtures(request: pytest.FixtureRequest) -> bool:
    """Whether the test's services run with `insecure: true` (marked `pytest.mark.insecure`) instead of keys."""
    return request.node.get_closest_marker("insecure") is not None


@pytest.fixture
def blobnode_factory(request: pytest.FixtureRequest, tmp_path: Path,
                     signed_as_operator: str) -> Iterator[BlobnodeFactory]:
    """Start real blobnode processes (with the role's keys); every one is stopped by PID at teardown."""
    with _blobnode_factory(request, tmp_path) as start:
        yield start


@contextmanager
def _blobnode_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobnodeFactory]:
    started: list[Service] = []

    def start(name: str = "bn", disks: int = 2, first_disk_id: int = 1, clustermgr: list[Service] | None = None,
              wait: bool = True, under: tuple[str, ...] = (), **overrides: object) -> Service:
        """A blobnode; with `clustermgr` its disks take ids from it, register and heartbeat. Without `wait` it is
        only spawned: its caller waits (`Service.ready`). `under`: a command that execs it (Service.under)."""
        workdir = tmp_path / name
        workdir.mkdir(exist_ok=True)
        port = free_port()
        config: dict[str, object] = {
            "bind_addr": f"127.0.0.1:{port}",
            "cluster_id": 1,
            "export_roots": [tempfile.gettempdir()],  # the tests' inspections write under their temporary folders
            "disks": [{"path": str(workdir / f"disk{i}"), "disk_id": first_disk_id + i} for i in range(disks)],
            **overrides,
        }
        if clustermgr:
            config["disks"] = [{"path": str(workdir / f"disk{i}")} for i in range(disks)]
            config["clustermgr_hosts"] = [cm.url for cm in clustermgr]
            config["heartbeat_interval"] = 0.5
        service = Service("blobnode", config, workdir, f"http://127.0.0.1:{port}",
                          insecure=insecure_fixtures(request), under=under)
        started.append(service)
        return service.start() if wait else service.spawn()

    try:
        yield start
    finally:  # a test's failure is thrown in here: its processes are stopped all the same
        stop_all(started)


@pytest.fixture
def clustermgr_factory(request: pytest.FixtureRequest, tmp_path: Path,
                       signed_as_operator: str) -> Iterator[Callable[..., list[Service]]]:
    """Start a Raft group of real clustermgr processes (with the role's keys); all are stopped by PID at teardown."""
    with _clustermgr_factory(request, tmp_path) as start:
        yield start


@contextmanager
def _clustermgr_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., list[Service]]]:
    started: list[Service] = []

    def start(count: int = 3, **overrides: object) -> list[Service]:
        members = {str(i): {"raft_addr": f"127.0.0.1:{free_port()}", "http_addr": f"127.0.0.1:{free_port()}"}
                   for i in range(1, count + 1)}
        services = []
        for node_id in range(1, count + 1):
            workdir = tmp_path / f"cm{node_id}"
            workdir.mkdir(exist_ok=True)
            config = {"node_id": node_id, "members": members, "data_dir": str(workdir / "data"),
                      "heartbeat_ms": 50, "election_timeout_ms": [300, 600], **overrides}
            url = f"http://{members[str(node_id)]['http_addr']}"
            services.append(Service("clustermgr", config, workdir, url, insecure=insecure_fixtures(request)))
        started.extend(services)
        start_all(services)
        return services

    try:
        yield start
    finally:  # a test's failure is thrown in here: its processes are stopped all the same
        stop_all(started)


@pytest.fixture
def cluster_factory(request: pytest.FixtureRequest, tmp_path: Path, clustermgr_factory: Callable[..., list[Service]],
                    blobnode_factory: BlobnodeFactory) -> Iterator[Callable[..., LocalCluster]]:
    """A whole local cluster of real processes: 3 clustermgr, blobnodes, allocator(s), access node(s), and
    with `pipelines=True` the session's Kafka broker, mqproxy, tinker and a worker; with `schedulers=K`, K
    schedulers and a worker; `blobnode` is config every blobnode gets."""
    with _cluster_factory(request, tmp_path, clustermgr_factory, blobnode_factory) as start:
        yield start


@pytest.fixture(scope="module")
def shared_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                   test_secret: str) -> Iterator[LocalCluster]:
    """One default cluster (`cluster_factory()`) for the tests of a module that leave it as they found it: each
    saves the ~6 s of starting its own."""
    root = tmp_path_factory.mktemp("shared")
    with pytest.MonkeyPatch.context() as monkeypatch, _signing_as_operator(test_secret, monkeypatch), \
            _clustermgr_factory(request, root) as clustermgrs, _blobnode_factory(request, root) as blobnodes, \
            _cluster_factory(request, root, clustermgrs, blobnodes) as start:
        yield start()


@contextmanager
def _cluster_factory(request: pytest.FixtureRequest, tmp_path: Path, clustermgr_factory: Callable[..., list[Service]],
                     blobnode_factory: BlobnodeFactory) -> Iterator[Callable[..., LocalCluster]]:
    started: list[Service] = []

    def launch(role: str, name: str, **config: object) -> Service:
        """Spawn a service; `start` waits for each batch it launches, so that a batch starts side by side."""
        workdir = tmp_path / name
        workdir.mkdir()
        port = free_port()
        service = Service(role, {"bind_addr": f"127.0.0.1:{port}", **config}, workdir, f"http://127.0.0.1:{port}",
                          insecure=insecure_fixtures(request))
        started.append(service)
        return service.spawn()

    def start(blobnodes: int = 6, disks: int = 1, code_mode: str = "EC3P3", min_volumes: int = 2,
              allocators: int = 1, access: int = 1, pipelines: bool = False, safe_delay: float = 2.0,
              tinker: dict[str, object] | None = None, clustermgr: dict[str, object] | None = None,
              schedulers: int = 0, scheduler: dict[str, object] | None = None,
              worker: dict[str, object] | None = None, blobnode: dict[str, object] | None = None,
              clustermgrs: int = 3, **access_overrides: object) -> LocalCluster:
        cms = clustermgr_factory(clustermgrs, **{"volume_check_interval": 0.2, "disk_heartbeat_timeout": 10,
                                                 "volume_lease_ttl": 10, "chunk_size": 256 << 20,
                                                 "first_volume_after_disks": blobnodes * disks,
                                                 "code_modes": [{"code_mode": code_mode, "min_volumes": min_volumes}],
                                                 **(clustermgr or {})})
        cm_urls = [cm.url for cm in cms]
        node_config = {"delete_hold": safe_delay, **(blobnode or {})}  # tinker's safe delay, as `cluster up` sets
        nodes = [blobnode_factory(f"bn{i}", disks=disks, clustermgr=cms, wait=False, **node_config)
                 for i in range(blobnodes)]
        for node in nodes:
            node.ready(30.0)
        # Allocators one by one once every disk is registered, as schedulers: the first leases the first volumes,
        # and a test that kills and restarts one counts on it holding some (it reclaims them).
        allocs = [launch("allocator", f"alloc{i}", clustermgr_hosts=cm_urls, code_modes=[code_mode],
                         retain_interval=2.0).ready(30.0) for i in range(allocators)]
        background: dict[str, Service] = {}
        for n in range(schedulers):  # the first to start is elected; the others stand by
            background[f"scheduler{n}"] = launch("scheduler", f"scheduler{n}", clustermgr_hosts=cm_urls,
                                                 **(scheduler or {})).ready(30.0)
        if pipelines or schedulers:
            background["worker"] = launch("worker", "worker", clustermgr_hosts=cm_urls, **(worker or {}))
        if pipelines:
            kafka = request.getfixturevalue("kafka_broker")
            cluster_id = random.randrange(2, 2**31)  # this cluster's messages only: tests share the broker
            background["mqproxy"] = launch("mqproxy", "mqproxy", clustermgr_hosts=cm_urls,
                                           cluster_id=cluster_id, kafka_bootstrap=kafka.bootstrap, partitions=2)
            background["tinker"] = launch("tinker", "tinker", clustermgr_hosts=cm_urls,
                                          cluster_id=cluster_id, kafka_bootstrap=kafka.bootstrap,
                                          delete_safe_delay=safe_delay,
                                          retry_base=0.5, retry_cap=2.0, group_prefix=f"tinker-{tmp_path.name}",
                                          delete_log=str(tmp_path / "tinker-deletes.jsonl"), **(tinker or {}))
        for service in background.values():
            service.ready(30.0)
        fronts: list[Service] = []

        def add_access(**overrides: object) -> Service:
            name = f"access{len(fronts)}"
            service = launch("access", name, secret=LocalCluster.secret, clustermgr_hosts=cm_urls,
                             allocator_hosts=[a.url for a in allocs],
                             orphan_log=str(tmp_path / f"{name}-orphans.jsonl"), delete_safe_delay=safe_delay,
                             state_file=str(tmp_path / f"{name}-state.sqlite"),
                             audit_log=str(tmp_path / f"{name}-audit.jsonl"),
                             # No standby stock unless a test asks: these clusters' 10 s leases could not carry
                             # its 60 s, and what it holds would blur the allocators' accounting tests check.
                             **{"standby_ride_out": 0.0, **access_overrides, **overrides})
            fronts.append(service)
            return service.ready(30.0)

        for _ in range(access):
            add_access()
        return LocalCluster(cms, nodes, allocs, fronts, add_access, background)

    try:
        yield start
    finally:  # a test's failure is thrown in here: its processes are stopped all the same
        stop_all(started)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server (Debian's) on a free port, stopped by PID at teardown."""
    port = free_port()
    workdir = tmp_path / "redis"
    workdir.mkdir()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: _accepts(port), 10, "redis-server")
        yield RedisServer(f"redis://127.0.0.1:{port}/0", proc)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False
