#!/usr/bin/env bash
# Instructions per engine cycle (create → allocated → release), counted by callgrind in a
# single-user PostgreSQL: the same count on every run, so a change of 0.5 % shows, where
# wall-clock cycles on a shared 2-core machine vary by 10 % (docs/benchmarks.md, "Counting
# instructions").
#
#   bench/instructions.sh [LABEL] [SCENARIO]   this checkout's SQL (its .venv's respool)
#
# LABEL defaults to "tree". SCENARIO: "engine" (default; bench cycles' 8 pools × 8 subjects),
# or the two pools of `python -m bench placement`'s cycles: "abstract" (800 GPUs) and "nodes"
# (100 nodes × 8 GPUs), whose quotient is that bench's nodes ÷ abstract without the noise.
#
# Needs valgrind and PostgreSQL's server binaries (initdb, pg_ctl, postgres: PG_BIN, default
# the newest /usr/lib/postgresql/*/bin). Run as root, the server runs as the OS user postgres.
# Prints "LABEL: N instructions per cycle". The count is the difference of two runs from the
# same data (50 warm-up cycles; the same 50 and 200 more), so start-up and first plans cancel.
set -euo pipefail
LABEL=${1:-tree}
SCENARIO=${2:-engine}
case $SCENARIO in engine|abstract|nodes) ;; *) echo "bench/instructions.sh: SCENARIO is engine, abstract or nodes, not '$SCENARIO'" >&2; exit 2;; esac
REPO=$(cd "$(dirname "$0")/.." && pwd)
PG_BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
WORK=${RESPOOL_INSTRUCTIONS_DIR:-/tmp/respool-instructions}
PORT=${RESPOOL_INSTRUCTIONS_PORT:-5497}
DIR=$WORK/$LABEL
DATA=$DIR/data
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -c "$*"; else bash -c "$*"; fi; }
command -v valgrind >/dev/null || { echo "bench/instructions.sh: valgrind is not installed" >&2; exit 2; }
[ -x "$PG_BIN/postgres" ] || { echo "bench/instructions.sh: no PostgreSQL server binaries (set PG_BIN)" >&2; exit 2; }

# Whatever ends the script (done, an error, Ctrl-C, a closed terminal, kill): no server or
# single-user run of it is left, and only the callgrind files and logs stay in $DIR.
SETUP=
cleanup() {
    [ -z "$SETUP" ] || kill "$SETUP" 2>/dev/null || true
    [ ! -f "$DATA/postmaster.pid" ] || as_pg "$PG_BIN/pg_ctl -D $DATA stop -m immediate" >/dev/null 2>&1 || true
    pkill -f -- "-D $DIR/run" 2>/dev/null || true
    for _ in $(seq 50); do pgrep -f -- "-D $DIR/run" >/dev/null || break; sleep 0.1; done
    rm -rf "$DATA" "$DIR/run"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

echo "$LABEL: counting the instructions of 200 $SCENARIO cycles, about a minute"
echo "  (files in $DIR)"
rm -rf "$DIR" && mkdir -p "$DIR" && chmod 777 "$WORK" "$DIR"
as_pg "$PG_BIN/initdb -D $DATA -A trust -U postgres" >/dev/null
as_pg "$PG_BIN/pg_ctl -D $DATA -o '-p $PORT -k $DIR -c fsync=off' -l $DIR/log start" >/dev/null
# (in the background, waited for, as the runs below: a signal ends the script at once)
(cd "$REPO" && exec .venv/bin/python - "$PORT" "$SCENARIO") <<'EOF' &
"""Migrate, make the scenario's pools and 8 subjects, 3,000 cycles of history, ANALYZE."""
import asyncio
import sys

from app.db.connect import connect
from app.db.migrate import migrate
from bench import common
from bench.cycles import setup_engine
from bench.placement import POOL, make_pool

CREATE = """SELECT c.request->>'id' FROM respool.create_request(jsonb_build_object(
    'subject', $1::text, 'pool', $2::text, 'resources', '{"gpu": 1}'::jsonb, 'lease_seconds', 300)) c"""


def pool_of(scenario: str, i: int) -> str:
    """The pool of cycle ``i`` (the same rule as the cycles counted below)."""
    return f"bench-p{i * 3 % 8 + 1}" if scenario == "engine" else POOL[scenario == "nodes"]


async def main(port: str, scenario: str) -> None:
    admin = await connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", application_name="x")
    await admin.execute("CREATE DATABASE cg")
    dsn = f"postgresql://postgres@127.0.0.1:{port}/cg"
    await migrate(await connect(dsn, application_name="x"))
    conn = await common.bench_connect(dsn)
    if scenario == "engine":
        await setup_engine(conn, 8, 8)
    else:
        pool = POOL[scenario == "nodes"]
        await make_pool(conn, pool, nodes=100, gpus_per_node=8, abstract=scenario == "abstract")
        for s in range(1, 9):
            await conn.execute("SELECT respool.create_policy(p_subject => $1, p_pool => $2)",
                               f"bench-s{s}", pool)
    for i in range(3000):
        rid = await conn.fetchval(CREATE, f"bench-s{i % 8 + 1}", pool_of(scenario, i))
        await conn.fetchval("SELECT respool.release_request(p_id => $1::uuid)", rid)
    await conn.execute("VACUUM ANALYZE")


asyncio.run(main(sys.argv[1], sys.argv[2]))
EOF
SETUP=$!
wait $SETUP
as_pg "$PG_BIN/pg_ctl -D $DATA stop" >/dev/null

# The cycles, one statement a line (single-user mode), the request id carried in a setting.
for i in $(seq 0 249); do
    case $SCENARIO in engine) pool=$((i * 3 % 8 + 1));; abstract) pool=0;; nodes) pool=1;; esac
    echo "SELECT set_config('x.rid', (SELECT c.request->>'id' FROM respool.create_request(jsonb_build_object('subject', 'bench-s$((i % 8 + 1))', 'pool', 'bench-p$pool', 'resources', '{\"gpu\": 1}'::jsonb, 'lease_seconds', 300)) c), false);"
    echo "SELECT respool.release_request(p_id => current_setting('x.rid')::uuid) IS NOT NULL;"
done > "$DIR/all.sql"
head -100 "$DIR/all.sql" > "$DIR/warm.sql"
chmod 644 "$DIR"/*.sql
count() {  # count NAME SQLFILE: instructions of a single-user run on a fresh copy of the data
    rm -rf "$DIR/run" && cp -a "$DATA" "$DIR/run"
    # (in the background, waited for: a signal to the script ends it at once, and cleanup the run)
    as_pg "valgrind --tool=callgrind --callgrind-out-file=$DIR/$1.out $PG_BIN/postgres --single -D $DIR/run -c fsync=off cg" \
        < "$2" > "$DIR/$1.log" 2> "$DIR/$1.valgrind" &
    wait $!
    if grep -q ERROR "$DIR/$1.log"; then echo "$1: a statement failed, see $DIR/$1.log" >&2; exit 1; fi
    grep -o "Collected : [0-9]*" "$DIR/$1.valgrind" | grep -o "[0-9]*$" > "$DIR/$1.count"
}
count warm "$DIR/warm.sql"
count all "$DIR/all.sql"
echo "$LABEL: $((($(cat "$DIR/all.count") - $(cat "$DIR/warm.count")) / 200)) instructions per cycle"
