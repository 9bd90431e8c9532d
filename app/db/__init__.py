"""Database access: the only place Python talks to PostgreSQL.

Every statement is a named block in ``sql/queries/<concern>.sql``, loaded once by
:func:`app.db.named.query`; each concern has one module of small typed wrappers with the same
name. No module assembles SQL, and the queries call only public ``respool.*`` functions.
Every RPxxx error the engine raises comes back as an :mod:`app.db.errors` exception.

=====================  ======================  ================================================
module                 queries                 what
=====================  ======================  ================================================
``pools``              ``pools.sql``           create/update/delete/get/list pools
``policies``           ``policies.sql``        create/update/delete/get/list policies
``nodes``              ``nodes.sql``           create/update/delete/get/list nodes, cordon and
                                               drain (docs/placement.md)
``requests``           ``requests.sql``        requests: create, read, list, release, cancel,
                                               heartbeat, delete, events
``reconcile``          ``reconcile.sql``       the reconciler's per-pool pass and engine steps,
                                               invariant violations
``tokens``             ``tokens.sql``          API tokens (stored as sha256 hashes)
``jobs``               ``jobs.sql``            jobs and agents: claim, agent jobs and heartbeat,
                                               logs, release with an exit code (docs/jobs.md)
``ops``                ``ops.sql``             retention (prune) and the reader role
``metrics``            ``metrics.sql``         usage, queue and event reads for ``/metrics``
``dashboard``          ``dashboard.sql``       the dashboard's one-snapshot read
``apply``              ``apply.sql``           applying a manifest in one transaction
``migrate``            ``migrate.sql``         the migration runner and its bookkeeping
``connect``            ``connect.sql``         connections, pools, codecs, the liveness probe
``embedded``           ``embedded.sql``        the embedded server's database
=====================  ======================  ================================================

Also here: ``executor`` (``Executor``, what every call runs on, and ``_as``, which reads an answer
into a wire type of :mod:`respool_client.wire`), ``named`` (the loader), ``errors`` (RPxxx →
exceptions), ``dsn``, ``sqlfiles``. What is not database access
lives outside: manifest diffing in :mod:`app.manifest`, subject globs in :mod:`app.globs`.
"""
