#!/bin/sh
# Starts one Sentinel (pod redis-sentinel-N). It monitors the primary the other Sentinels
# know, else the one a data node says it is, else redis-node-0 (the first start). Sentinel
# rewrites its configuration file as it learns: it lives on the pod's emptyDir, readable by
# this user only (it holds the password).
#
# The password of the Secret allot-redis (ALLOT_REDIS_PASSWORD): the Sentinel logs in to
# the data nodes with it (auth-pass) and takes it itself (requirepass, which it also logs
# in to the other Sentinels with), so that a pod without it can neither ask a Sentinel
# for the primary nor tell it to fail over or to monitor another server. redis-cli logs
# in with it through REDISCLI_AUTH.
set -eu
: "${ALLOT_REDIS_PASSWORD:?no ALLOT_REDIS_PASSWORD (the Secret allot-redis)}"
export REDISCLI_AUTH="$ALLOT_REDIS_PASSWORD"
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
# Sentinel resolves the primary's name when it reads the file: wait until it resolves
# (and answers the password: redis-cli exits 0 on an error answer too).
until timeout 3 redis-cli -h "$primary" ping 2>/dev/null | grep -qx PONG; do
  echo "sentinel: waiting for $primary"
  sleep 2
done
echo "sentinel: $self monitors $primary"
umask 077
cat >/data/sentinel.conf <<CONF
port 26379
protected-mode no
requirepass $ALLOT_REDIS_PASSWORD
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel announce-ip $self
sentinel monitor allot $primary 6379 2
sentinel auth-pass allot $ALLOT_REDIS_PASSWORD
sentinel down-after-milliseconds allot 5000
sentinel failover-timeout allot 30000
sentinel parallel-syncs allot 1
CONF
exec redis-server /data/sentinel.conf --sentinel
