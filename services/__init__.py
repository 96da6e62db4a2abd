"""Engram's server processes: the consolidator, the query service, `make run` and `engram-admin`."""
