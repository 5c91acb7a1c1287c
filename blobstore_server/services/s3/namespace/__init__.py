"""The S3 gateway's namespace: buckets, keys and their manifests in SQL (SQLite today; one schema, one store, a
dialect per engine). It never touches blob bytes: objects are lists of extents naming the access service's
Locations."""

from blobstore_server.services.s3.namespace.dialect import SQLITE, Dialect, sqlite_connect
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
from blobstore_server.services.s3.namespace.store import NamespaceStore, NoSuchUser, UserExists, open_sqlite

__all__ = ["SQLITE", "Bucket", "Condition", "Credentials", "Dialect", "Extent", "Garbage", "IfMatch", "IfNoneMatch",
           "Intent", "ListedObject", "NamespaceStore", "NoSuchUser", "ObjectMeta", "ObjectRecord", "ObjectsPage",
           "Part", "PartsPage", "Upload", "UploadsPage", "User", "UserExists", "continuation_token", "open_sqlite",
           "sqlite_connect", "token_marker"]
