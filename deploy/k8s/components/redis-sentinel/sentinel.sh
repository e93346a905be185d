#!/bin/sh
# Starts one Sentinel (pod redis-sentinel-N). It monitors the primary the other Sentinels
# know, else the one a data node says it is, else redis-node-0 (the first start). Sentinel
# rewrites its configuration file as it learns: it lives on the pod's emptyDir.
set -eu
self="${POD_NAME}.redis-sentinel"
primary=""
for i in 0 1 2; do
  peer="redis-sentinel-$i.redis-sentinel"
  [ "$peer" = "$self" ] && continue
  answer=$(timeout 3 redis-cli -h "$peer" -p 26379 --raw \
    sentinel get-master-addr-by-name allot 2>/dev/null | head -n 1) || answer=""
  case "$answer" in
    "" | ERR* | *" "*) ;;
    *) primary="$answer"; break ;;
  esac
done
if [ -z "$primary" ]; then
  for i in 0 1; do
    node="redis-node-$i.redis-node"
    if timeout 3 redis-cli -h "$node" info replication 2>/dev/null | grep -q '^role:master'; then
      primary="$node"
      break
    fi
  done
fi
[ -n "$primary" ] || primary="redis-node-0.redis-node"
# Sentinel resolves the primary's name when it reads the file: wait until it resolves.
until timeout 3 redis-cli -h "$primary" ping >/dev/null 2>&1; do
  echo "sentinel: waiting for $primary"
  sleep 2
done
echo "sentinel: $self monitors $primary"
cat >/data/sentinel.conf <<CONF
port 26379
protected-mode no
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel announce-ip $self
sentinel monitor allot $primary 6379 2
sentinel down-after-milliseconds allot 5000
sentinel failover-timeout allot 30000
sentinel parallel-syncs allot 1
CONF
exec redis-server /data/sentinel.conf --sentinel
