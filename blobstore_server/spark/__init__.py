"""Spark jobs over a whole cluster: the offline volume inspection (`inspect`) and the repair backlog
(`backlog`). Both run on `local[*]` or, unchanged, on a Spark cluster (`--master`)."""
