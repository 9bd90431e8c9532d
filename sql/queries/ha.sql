-- server_role --
-- The server this connection is on (address and port as the server sees them; null address on
-- a unix socket) and whether it is a standby: the listener and the reconciler reconnect until
-- they are on the primary, and /readyz names the node that serves.
SELECT host(inet_server_addr()) AS addr, inet_server_port() AS port,
       pg_is_in_recovery() AS standby, pg_postmaster_start_time() AS started;

-- service_alive --
-- An API process is up and takes heartbeats: record it; after a gap in the service's liveness,
-- every held lease first gets the gap back (respool.service_alive, docs/preemption.md).
SELECT respool.service_alive() AS doc;
