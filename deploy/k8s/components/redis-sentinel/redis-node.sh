#!/bin/sh
# Starts one Redis data node (pod redis-node-N): as the primary, or as a replica of it.
# Which node is the primary: what the Sentinels say (they follow every failover); else a
# data node that says it is one (the Sentinels restarting all at once); else, on the very
# first start, redis-node-0. Nothing is kept on disk: a node restarted as the primary
# comes back empty and its replica resyncs empty, which accounting notices and repairs by
# rebuilding from the log (services/accounting.py, "The store follows the log").
# Every node and Sentinel takes the password of the Secret allot-redis
# (ALLOT_REDIS_PASSWORD); redis-cli logs in with it through REDISCLI_AUTH.
set -eu
: "${ALLOT_REDIS_PASSWORD:?no ALLOT_REDIS_PASSWORD (the Secret allot-redis)}"
export REDISCLI_AUTH="$ALLOT_REDIS_PASSWORD"
self="${POD_NAME}.redis-node"
primary=""
for i in 0 1 2; do
  answer=$(timeout 3 redis-cli -h "redis-sentinel-$i.redis-sentinel" -p 26379 --raw \
    sentinel get-master-addr-by-name allot 2>/dev/null | head -n 1) || answer=""
  case "$answer" in
    "" | ERR* | *" "*) ;;
    *) primary="$answer"; break ;;
  esac
done
if [ -z "$primary" ]; then
  for i in 0 1; do
    node="redis-node-$i.redis-node"
    [ "$node" = "$self" ] && continue
    if timeout 3 redis-cli -h "$node" info replication 2>/dev/null | grep -q '^role:master'; then
      primary="$node"
    fi
  done
fi
[ -n "$primary" ] || primary="redis-node-0.redis-node"
echo "redis-node: $self starts with primary $primary"
# A replica's full sync leaves the primary's snapshot in /data, which outlives a restart of
# this container (an emptyDir lives as long as the pod) and which Redis would load at
# start: remove it, so a node always starts empty.
rm -f /data/dump.rdb
# The node announces its stable DNS name, not its pod IP, so the Sentinels keep finding
# it after a restart (Sentinel's resolve-hostnames, sentinel.sh). It takes the password
# (requirepass) and gives it to the primary it replicates from (masterauth): either node
# may be the primary after a failover. redis-server overwrites its command line with its
# title, so `ps` shows no password.
set -- redis-server --save "" --appendonly no --protected-mode no \
  --replica-announce-ip "$self" --replica-announce-port 6379 \
  --requirepass "$ALLOT_REDIS_PASSWORD" --masterauth "$ALLOT_REDIS_PASSWORD"
if [ "$primary" != "$self" ]; then
  set -- "$@" --replicaof "$primary" 6379
fi
exec "$@"
