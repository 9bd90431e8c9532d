-- Connection checks (app/db/connect.py).

-- connection_probe --
-- A round trip that proves the connection is alive.
SELECT 1;
