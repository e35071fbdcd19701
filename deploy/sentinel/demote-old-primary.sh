#!/bin/sh
# Sentinel's client-reconfig-script for toolloop (docs/operations.md, "Sentinel, failover and
# TOOLLOOP_COMMIT_WAIT"): the moment a failover has promoted a replica, the leading sentinel makes
# the OLD primary a replica of the new one, instead of leaving it writable until the sentinels
# convert it themselves (about 10-20 s: their INFO period plus 8 s, then a full resync). Clients
# still pooled on the old primary get READONLY at once and move, and the new primary has a replica
# again within about a second, so `WAIT` (TOOLLOOP_COMMIT_WAIT) is confirmed again.
#
# Sentinel runs it on every sentinel as
#     <master-name> <role> <state> <from-ip> <from-port> <to-ip> <to-port>
# (role `leader` on the sentinel that led the failover, `observer` on the others); only the leader
# acts. The old primary may be down (a crash): the command then fails and the sentinels convert it
# when it comes back, as without this script.
#
# Install: copy it where every sentinel can read it, `chmod +x` it (Sentinel refuses a script that
# is not executable), and add to each sentinel.conf (Sentinel takes scripts from its config file
# only: with `sentinel deny-scripts-reconfig yes`, the default, SENTINEL SET cannot set them):
#     sentinel client-reconfig-script <master-name> /path/to/demote-old-primary.sh
# A password for the data nodes: REDISCLI_AUTH in the sentinel's environment (redis-cli reads it);
# REDIS_CLI names the redis-cli binary (default: redis-cli on PATH). No TLS: for `tls-port`-only
# nodes this script does nothing useful (redis-cli would need --tls and certificates).
#
# It always exits 0: Sentinel retries a script that exits 1 (up to 10 times) and a script that
# exits 2 or more is not retried but logged as an error; a demotion that failed is not worth either.

[ "$2" = "leader" ] || exit 0
from_ip=$4
from_port=$5
to_ip=$6
to_port=$7
[ -n "$from_ip" ] && [ -n "$from_port" ] && [ -n "$to_ip" ] && [ -n "$to_port" ] || exit 0
[ "$from_ip:$from_port" = "$to_ip:$to_port" ] && exit 0
cli=${REDIS_CLI:-redis-cli}
if command -v timeout >/dev/null 2>&1; then
    timeout 5 "$cli" -h "$from_ip" -p "$from_port" REPLICAOF "$to_ip" "$to_port" >/dev/null 2>&1
else
    "$cli" -h "$from_ip" -p "$from_port" REPLICAOF "$to_ip" "$to_port" >/dev/null 2>&1
fi
exit 0
