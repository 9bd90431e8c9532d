"""Database access: connections, embedded server, migrations."""
