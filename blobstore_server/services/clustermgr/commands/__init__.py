"""Every clustermgr Raft command: its typed payload, its typed result, and the function that applies it, in one
table (`table.py`), filled by the modules of each domain when this package is imported. Applying is deterministic:
the leader's clock travels in `now`, and every choice (which disk, which vid) was made before proposing; applying
only validates and writes.
"""

# Each module registers its commands in the table as it is imported.
from blobstore_server.services.clustermgr.commands import disks, keys, services, units, volumes  # noqa: F401
