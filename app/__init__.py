"""respool: a PostgreSQL-backed resource-pool allocator."""

__version__ = "0.1.0"
