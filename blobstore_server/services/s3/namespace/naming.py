"""S3's bucket naming rules (general purpose buckets), as one predicate."""

from __future__ import annotations

import re

_SHAPE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IP = re.compile(r"\d{1,3}(\.\d{1,3}){3}")
_RESERVED_STARTS = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_ENDS = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def valid_bucket_name(name: str) -> bool:
    """3-63 of a-z 0-9 . -, starting and ending with a letter or digit, no `..`, `.-` or `-.`, not an IP address,
    none of AWS's reserved prefixes and suffixes."""
    return (_SHAPE.fullmatch(name) is not None and _IP.fullmatch(name) is None
            and not any(bad in name for bad in ("..", ".-", "-."))
            and not name.startswith(_RESERVED_STARTS) and not name.endswith(_RESERVED_ENDS))
