"""Multipart uploads in the namespace: an upload row, a row per part (its own manifest), and Complete, which turns
the listed parts into one object without copying a byte (completion.py has the rules)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.namespace.base import (
    Row,
    StoreBase,
    Tx,
    check_key,
    decode_manifest,
    decode_meta,
    encode_manifest,
    encode_meta,
    new_id,
)
from blobstore_server.services.s3.namespace.completion import check_part_number, complete
from blobstore_server.services.s3.namespace.listing import Query, Source, list_page
from blobstore_server.services.s3.namespace.records import (
    Condition,
    Intent,
    Manifest,
    ObjectMeta,
    ObjectRecord,
    Part,
    PartsPage,
    Upload,
    UploadsPage,
    bare_etag,
)

UploadPosition = tuple[bytes, str]  # (key, upload id)
_UPLOAD_COLUMNS = "id, key, initiated_ms, owner, meta"
_PART_COLUMNS = "number, size, etag, mtime_ms, checksums, manifest"


def _upload(row: Row) -> Upload:
    upload_id, key, initiated_ms, owner, meta = row
    return Upload(upload_id, bytes(key), initiated_ms, owner, decode_meta(meta))


def _part(row: Row) -> Part:
    number, size, etag, mtime_ms, checksums, manifest = row
    return Part(number, size, etag, mtime_ms, json.loads(checksums), decode_manifest(manifest))


def _upload_key(upload: Upload) -> bytes:
    return upload.key


def _upload_position(upload: Upload) -> UploadPosition:
    return upload.key, upload.id


class Uploads(StoreBase):
    """The multipart operations of NamespaceStore."""

    def create_upload(self, bucket: str, key: bytes, owner: str, meta: ObjectMeta | None = None) -> Upload:
        check_key(key)
        with self.transaction(write=True) as tx:
            bucket_id = self.bucket_id(tx, bucket)
            now = self.clock()
            upload = Upload(new_id(now), key, now, owner, meta or ObjectMeta())
            tx.run(f"INSERT INTO uploads (bucket_id, {_UPLOAD_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                   (bucket_id, upload.id, key, now, owner, encode_meta(upload.meta)))
        return upload

    def get_upload(self, bucket: str, upload_id: str) -> Upload:
        with self.transaction(write=False) as tx:
            return self._upload(tx, self.bucket_id(tx, bucket), upload_id)

    def _upload(self, tx: Tx, bucket_id: str, upload_id: str, lock: bool = False) -> Upload:
        row = tx.one(f"SELECT {_UPLOAD_COLUMNS} FROM uploads WHERE bucket_id = ? AND id = ?"
                     + ("{lock}" if lock else ""), (bucket_id, upload_id))
        if row is None:
            raise S3Error("NoSuchUpload", "no multipart upload has this id", upload_id)
        return _upload(row)

    def put_part(self, bucket: str, upload_id: str, part_number: int, size: int, etag: str, manifest: Manifest,
                 intent: Intent | None, checksums: dict[str, str] | None = None) -> Part:
        """Record an uploaded part (its manifest's offsets from 0); a part of the same number is replaced and its
        blobs go to GC; the intent is closed."""
        check_part_number(part_number)

        def write(tx: Tx, bucket_id: str) -> Part:
            self._upload(tx, bucket_id, upload_id, lock=True)
            part = Part(part_number, size, bare_etag(etag), self.clock(), checksums or {}, manifest)
            old = tx.one("SELECT manifest FROM parts WHERE bucket_id = ? AND upload_id = ? AND number = ?",
                         (bucket_id, upload_id, part_number))
            if old is not None:
                kept = {e.location for e in manifest}
                self.send_to_gc(tx, bucket_id, (e.location for e in decode_manifest(old[0]) if e.location not in kept))
                tx.run("DELETE FROM parts WHERE bucket_id = ? AND upload_id = ? AND number = ?",
                       (bucket_id, upload_id, part_number))
            tx.run(f"INSERT INTO parts (bucket_id, upload_id, {_PART_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                   (bucket_id, upload_id, part.number, part.size, part.etag, part.last_modified_ms,
                    json.dumps(part.checksums), encode_manifest(manifest)))
            return part

        return self.settle_intent(bucket, intent, write)

    def list_parts(self, bucket: str, upload_id: str, part_number_marker: int = 0,
                   max_parts: int = 1000) -> PartsPage:
        with self.transaction(write=False) as tx:
            bucket_id = self.bucket_id(tx, bucket)
            upload = self._upload(tx, bucket_id, upload_id)
            rows = tx.all(f"SELECT {_PART_COLUMNS} FROM parts WHERE bucket_id = ? AND upload_id = ? AND number > ? "
                          "ORDER BY number LIMIT ?", (bucket_id, upload_id, part_number_marker, max(max_parts, 0) + 1))
        parts = [_part(row) for row in rows]
        truncated = len(parts) > max_parts
        parts = parts[:max(max_parts, 0)]
        return PartsPage(upload, parts, truncated, parts[-1].number if truncated and parts else None)

    def complete_upload(self, bucket: str, upload_id: str, parts: Sequence[tuple[int, str]],
                        condition: Condition = None) -> ObjectRecord:
        """Make the listed (part number, ETag) parts the object at the upload's key, if `condition` holds there:
        unlisted parts' blobs and the object it replaces go to GC, the upload is gone."""
        with self.transaction(write=True) as tx:
            bucket_id = self.bucket_id(tx, bucket)
            upload = self._upload(tx, bucket_id, upload_id, lock=True)
            rows = tx.all(f"SELECT {_PART_COLUMNS} FROM parts WHERE bucket_id = ? AND upload_id = ?",
                          (bucket_id, upload_id))
            done = complete(parts, {part.number: part for part in map(_part, rows)})
            record = ObjectRecord(upload.key, done.size, done.etag, self.clock(), upload.meta, done.checksums,
                                  len(parts), done.manifest)
            self.replace_object(tx, bucket_id, record, condition)
            self.send_to_gc(tx, bucket_id, (e.location for part in done.unlisted for e in part.manifest))
            self._drop_rows(tx, bucket_id, upload_id)
        return record

    def abort_upload(self, bucket: str, upload_id: str) -> None:
        """Give up an upload: every part's blobs go to GC."""
        with self.transaction(write=True) as tx:
            bucket_id = self.bucket_id(tx, bucket)
            self._upload(tx, bucket_id, upload_id, lock=True)
            self.drop_upload(tx, bucket_id, upload_id)

    def drop_upload(self, tx: Tx, bucket_id: str, upload_id: str) -> None:
        rows = tx.all("SELECT manifest FROM parts WHERE bucket_id = ? AND upload_id = ?", (bucket_id, upload_id))
        self.send_to_gc(tx, bucket_id, (e.location for (manifest,) in rows for e in decode_manifest(manifest)))
        self._drop_rows(tx, bucket_id, upload_id)

    def _drop_rows(self, tx: Tx, bucket_id: str, upload_id: str) -> None:
        tx.run("DELETE FROM parts WHERE bucket_id = ? AND upload_id = ?", (bucket_id, upload_id))
        tx.run("DELETE FROM uploads WHERE bucket_id = ? AND id = ?", (bucket_id, upload_id))

    def list_uploads(self, bucket: str, prefix: bytes = b"", delimiter: bytes = b"", key_marker: bytes | None = None,
                     upload_id_marker: str | None = None, max_uploads: int = 1000) -> UploadsPage:
        """ListMultipartUploads: by key, then initiation time; the upload id marker counts only with a key marker."""
        with self.transaction(write=False) as tx:
            bucket_id = self.bucket_id(tx, bucket)

            def fetch(lo: bytes, after: UploadPosition | None, hi: bytes | None, limit: int) -> list[Upload]:
                where, params = "bucket_id = ? AND key >= ?", [bucket_id, lo]
                if hi is not None:
                    where, params = where + " AND key < ?", [*params, hi]
                if after is not None:
                    where += " AND (key > ? OR (key = ? AND id > ?))"
                    params = [*params, after[0], after[0], after[1]]
                rows = tx.all(f"SELECT {_UPLOAD_COLUMNS} FROM uploads WHERE {where} ORDER BY key, id LIMIT ?",
                              (*params, limit))
                return [_upload(row) for row in rows]

            after: UploadPosition | None = None
            if key_marker is not None and upload_id_marker:
                after = (key_marker, upload_id_marker)
            page = list_page(Source(fetch, key=_upload_key, position=_upload_position),
                             Query(prefix, delimiter, key_marker, after, max_uploads))
        last = page.last
        if isinstance(last, Upload):
            return UploadsPage(page.entries, page.prefixes, page.truncated, last.key, last.id)
        return UploadsPage(page.entries, page.prefixes, page.truncated, last, None)
