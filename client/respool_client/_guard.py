"""The guard of CMD's process group under ``respool run`` (run as a script, stdlib only).

It reads CMD's process group id on its first stdin line, then waits for the end of its stdin,
a pipe only the wrapper writes to. The wrapper writes ``done`` once the group is gone. If the
pipe closes without it, the wrapper died (SIGKILL, OOM, a crash): the guard SIGKILLs the whole
group, so nothing CMD started outlives the wrapper. It ignores every signal it can, so only the
wrapper's death (or SIGKILL of the guard itself) ends it.
"""

import os
import signal
import sys
import time

IGNORED = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGPIPE")


def main() -> None:
    for name in IGNORED:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    first = sys.stdin.readline().strip()
    if not first:
        return
    pgid = int(first)
    if sys.stdin.read().strip() == "done":
        return
    for _ in range(50):  # until the group is gone (a zombie still counts: bounded)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.1)


if __name__ == "__main__":
    main()
