"""Shared HTTP plumbing: typed errors, the service app factory and the client transport."""
