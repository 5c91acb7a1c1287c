"""A replicated kv on the Raft library (server, client, wire format, a local cluster of its processes) and the
in-memory network the randomized core tests run on: test and benchmark scaffolding, not shipped."""
