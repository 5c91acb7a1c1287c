"""Hand-packed binary encoding of peer messages (struct, network byte order).

Frame body: type (u8), term (u64), from (u32), to (u32), then the type's fixed fields, then its
variable part (entries of an Append, bytes of a SnapChunk).
"""

from __future__ import annotations

import struct

from blobstore_server.libs.raft.messages import (
    Append,
    AppendResp,
    Entry,
    EntryKind,
    Message,
    PreVote,
    PreVoteResp,
    SnapAck,
    SnapChunk,
    Vote,
    VoteResp,
)

_HEAD = struct.Struct("!BQII")
_ENTRY = struct.Struct("!QQBI")
_FIXED: dict[type[Message], tuple[int, struct.Struct, tuple[str, ...]]] = {
    PreVote: (1, struct.Struct("!QQ"), ("last_index", "last_term")),
    PreVoteResp: (2, struct.Struct("!?"), ("granted",)),
    Vote: (3, struct.Struct("!QQ"), ("last_index", "last_term")),
    VoteResp: (4, struct.Struct("!?"), ("granted",)),
    Append: (5, struct.Struct("!QQQQQQ"), ("prev_index", "prev_term", "commit", "seq", "ck_index", "ck_value")),
    AppendResp: (6, struct.Struct("!?QQQ"), ("success", "index", "hint", "seq")),
    SnapChunk: (7, struct.Struct("!QQQQ"), ("index", "snap_term", "offset", "total")),
    SnapAck: (8, struct.Struct("!QQ?"), ("index", "next_offset", "done")),
}
_BY_CODE = {code: (cls, fixed, names) for cls, (code, fixed, names) in _FIXED.items()}


def encode(msg: Message) -> bytes:
    code, fixed, names = _FIXED[type(msg)]
    parts = [_HEAD.pack(code, msg.term, msg.frm, msg.to), fixed.pack(*(getattr(msg, n) for n in names))]
    if isinstance(msg, Append):
        parts.append(struct.pack("!I", len(msg.entries)))
        for e in msg.entries:
            parts.append(_ENTRY.pack(e.index, e.term, e.kind, len(e.data)))
            parts.append(e.data)
    elif isinstance(msg, SnapChunk):
        parts.append(msg.data)
    return b"".join(parts)


def decode(buf: bytes) -> Message:
    code, term, frm, to = _HEAD.unpack_from(buf, 0)
    cls, fixed, names = _BY_CODE[code]
    pos = _HEAD.size
    values = dict(zip(names, fixed.unpack_from(buf, pos), strict=True))
    pos += fixed.size
    if cls is Append:
        (count,) = struct.unpack_from("!I", buf, pos)
        pos += 4
        entries = []
        for _ in range(count):
            index, eterm, kind, size = _ENTRY.unpack_from(buf, pos)
            pos += _ENTRY.size
            entries.append(Entry(index, eterm, EntryKind(kind), bytes(buf[pos:pos + size])))
            pos += size
        values["entries"] = entries
    elif cls is SnapChunk:
        values["data"] = bytes(buf[pos:])
    return cls(term, frm, to, **values)
