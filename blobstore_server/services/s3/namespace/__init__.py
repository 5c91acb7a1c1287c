"""The S3 gateway's namespace: buckets, keys and their manifests in SQL, on SQLite (one machine's gateways) or
PostgreSQL (one schema, one store, a dialect per engine; `open_namespace` takes a file path or a DSN). It never
touches blob bytes: objects are lists of extents naming the access service's Locations."""

from blobstore_server.services.s3.namespace.dialect import (
    POSTGRESQL,
    SQLITE,
    Dialect,
    engine,
    postgres_connect,
    sqlite_connect,
)
from blobstore_server.services.s3.namespace.listing import continuation_token, token_marker
from blobstore_server.services.s3.namespace.records import (
    Bucket,
    Condition,
    Credentials,
    Extent,
    Garbage,
    IfMatch,
    IfNoneMatch,
    Intent,
    ListedObject,
    ObjectMeta,
    ObjectRecord,
    ObjectsPage,
    Part,
    PartsPage,
    Upload,
    UploadsPage,
    User,
)
from blobstore_server.services.s3.namespace.store import (
    NamespaceStore,
    NoSuchUser,
    UserExists,
    open_namespace,
    open_sqlite,
)

__all__ = ["POSTGRESQL", "SQLITE", "Bucket", "Condition", "Credentials", "Dialect", "Extent", "Garbage", "IfMatch",
           "IfNoneMatch", "Intent", "ListedObject", "NamespaceStore", "NoSuchUser", "ObjectMeta", "ObjectRecord",
           "ObjectsPage", "Part", "PartsPage", "Upload", "UploadsPage", "User", "UserExists", "continuation_token",
           "engine", "open_namespace", "open_sqlite", "postgres_connect", "sqlite_connect", "token_marker"]
