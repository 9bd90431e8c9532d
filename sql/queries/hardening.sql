-- socket_permissions --
-- The embedded server's unix_socket_permissions (app/db/embedded.py keeps it at 0700).
SHOW unix_socket_permissions;

-- private_socket --
-- Later starts of the embedded server create its socket for the owner only: the
-- server trusts every local connection, so only its owner may reach it.
ALTER SYSTEM SET unix_socket_permissions = '0700';
