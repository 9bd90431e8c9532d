"""The README's walkthroughs, run in order on a fresh database against a real server, as a new
user would type them: each block marked ``<!-- walkthrough -->`` in README.md, taken from the
README itself (never a copy), must exit 0. So one section can never again collide with another
(a pool created twice, GPUs asked for that an earlier section still holds).

Shell blocks run in bash (``set -eo pipefail``) with the installed ``respool`` on ``PATH`` and
``RESPOOL_URL`` naming the server; ``curl`` fails on an HTTP error (``--fail-with-body``), so a
refused call fails its block. Python blocks run in the installed interpreter, SQL blocks on the
server's database (what ``respool db shell`` opens). The README's address,
``http://127.0.0.1:8080``, becomes the test server's.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
from pathlib import Path

import asyncpg
import pytest

from support.repo import REPO
from support.server import running_server

README_URL = "http://127.0.0.1:8080"
MARK = re.compile(r"<!-- walkthrough -->\s*\n```(\w+)\n(.*?)\n```", re.S)

# A `curl` that fails on an HTTP error (the README's calls use -s and print the body).
CURL = 'curl() { command curl --show-error --fail-with-body "$@"; }\n'

# Without a real curl: the few options the README uses, through httpx.
CURL_SHIM = """#!{python}
import sys, httpx
args, method, headers, body, url = sys.argv[1:], "GET", {{}}, None, None
while args:
    a = args.pop(0)
    if a.startswith("-X"):
        method = a[2:] or args.pop(0)
    elif a == "-H":
        k, _, v = args.pop(0).partition(":")
        headers[k.strip()] = v.strip()
    elif a == "-d":
        body, method = args.pop(0), method if method != "GET" else "POST"
    elif a.startswith("-"):
        continue
    else:
        url = a
r = httpx.request(method, url, headers=headers, content=body, timeout=60)
sys.stdout.write(r.text)
sys.exit(0 if r.status_code < 400 else 22)
"""

# What the README's pipeline step runs (`respool run ... -- python train.py`).
TRAIN_PY = 'import os\nprint("training on", os.environ["RESPOOL_RESOURCES"])\n'


def walkthrough_blocks() -> list[tuple[str, str]]:
    """(language, text) of each marked block, in README order."""
    return MARK.findall((REPO / "README.md").read_text())


def test_the_readme_marks_its_walkthroughs() -> None:
    languages = [lang for lang, _ in walkthrough_blocks()]
    assert languages.count("sh") >= 3 and "python" in languages and "sql" in languages


async def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


@pytest.mark.slow  # the 8-GPU machine's steps run for seconds by design
async def test_readme_walkthroughs_run_in_order(db_url: str, tmp_path: Path) -> None:
    blocks = walkthrough_blocks()
    bin_dir = Path(sys.executable).parent  # the installed respool and python
    assert (bin_dir / "respool").exists()
    path = [str(bin_dir), os.environ.get("PATH", "")]
    prelude = CURL
    if shutil.which("curl") is None:
        shims = tmp_path / "shims"
        shims.mkdir()
        shim = shims / "curl"
        shim.write_text(CURL_SHIM.format(python=sys.executable))
        shim.chmod(0o755)
        path.insert(0, str(shims))
        prelude = ""
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(TRAIN_PY)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPOOL_")}
    env["PATH"] = os.pathsep.join(path)

    async with running_server(db_url, with_reconciler=True) as srv:
        env["RESPOOL_URL"] = srv.url
        for i, (lang, text) in enumerate(blocks, 1):
            code = text.replace(README_URL, srv.url)
            where = f"README walkthrough block {i} ({lang}):\n{text}\n--- output:\n"
            if lang == "sh":
                script = "set -eo pipefail\n" + prelude + code
                rc, out = await _run(["bash", "-c", script], work, env)
                assert rc == 0, where + out
            elif lang == "python":
                rc, out = await _run([sys.executable, "-c", code], work, env)
                assert rc == 0, where + out
            elif lang == "sql":
                conn = await asyncpg.connect(db_url)
                try:
                    await conn.execute(code)
                finally:
                    await conn.close()
            else:
                pytest.fail(f"block {i}: no way to run a {lang!r} block")
