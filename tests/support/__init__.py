"""Helpers shared by every test directory.

``tests/`` is on ``sys.path`` (``pythonpath`` in pyproject's pytest section), so tests import
``support.<module>``; ``app`` and ``cli`` always come from the installed distribution.

* :mod:`support.ports` — free loopback ports;
* :mod:`support.db` — databases and connections (async work from sync fixtures, fingerprints);
* :mod:`support.server` — the API in the test's event loop, or ``respool serve`` as a process;
* :mod:`support.http` — answer checks and the small setups the API tests share;
* :mod:`support.cli` — ``respool`` through Typer's runner, one-line error checks;
* :mod:`support.faults` — short/long mode, figures and the invariant auditor of tests/faults;
* :mod:`support.scenario` — the scripted history of the ops tests.
"""
