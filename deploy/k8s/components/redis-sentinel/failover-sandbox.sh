#!/bin/bash
# Runs this component's scripts (redis-node.sh, sentinel.sh) and haproxy.cfg on one Linux
# machine, without Kubernetes, and fails the primary over twice (docs/deploy-kubernetes.md,
# "What was run"). Needs root (for unshare), redis-server and redis-cli 7, and haproxy:
#
#   sudo deploy/k8s/components/redis-sentinel/failover-sandbox.sh
#
# Each "pod" is a process with its own loopback address; the pods' DNS names are in a
# private /etc/hosts, in a network and mount namespace of their own (nothing binds on the
# machine's own ports). HAProxy resolves those names when it starts, instead of through its
# DNS resolver as in the cluster. Every piece takes a throwaway password, as the pods take
# the Secret allot-redis's. Not part of the test suite.
set -euo pipefail
if [ "${IN_SANDBOX:-}" != 1 ]; then
  IN_SANDBOX=1 exec unshare --net --mount --fork "$0" "$@"
fi
SRC=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
# What the pods get from the Secret allot-redis: the scripts and HAProxy's check read
# ALLOT_REDIS_PASSWORD, redis-cli (the scripts' and the checks below) REDISCLI_AUTH.
ALLOT_REDIS_PASSWORD="r$(head -c 24 /dev/urandom | base64 | tr '+/' '-_')"
export ALLOT_REDIS_PASSWORD REDISCLI_AUTH="$ALLOT_REDIS_PASSWORD"
ip link set lo up
cat >"$W/hosts" <<HOSTS
127.0.0.1 localhost
127.0.1.1 redis-node-0.redis-node
127.0.1.2 redis-node-1.redis-node
127.0.1.11 redis-sentinel-0.redis-sentinel
127.0.1.12 redis-sentinel-1.redis-sentinel
127.0.1.13 redis-sentinel-2.redis-sentinel
HOSTS
mount --bind "$W/hosts" /etc/hosts
declare -A IP=([redis-node-0]=127.0.1.1 [redis-node-1]=127.0.1.2
  [redis-sentinel-0]=127.0.1.11 [redis-sentinel-1]=127.0.1.12 [redis-sentinel-2]=127.0.1.13)
# A pod has an address of its own: each redis-server here binds its pod's.
mkdir -p "$W/bin"
printf '#!/bin/sh\nexec %s "$@" --bind "$MY_IP"\n' "$(command -v redis-server)" >"$W/bin/redis-server"
chmod +x "$W/bin/redis-server"

start() {  # start POD SCRIPT: the script execs redis-server, so the pid is the server's
  mkdir -p "$W/$1"
  sed "s#/data/#$W/$1/#g" "$SRC/$2" >"$W/$1/$2"
  # In its own folder, as the image's working directory /data: a replica's full sync
  # writes an RDB file there.
  (cd "$W/$1" && POD_NAME=$1 MY_IP=${IP[$1]} PATH="$W/bin:$PATH" exec sh "$W/$1/$2") \
    >"$W/$1/log" 2>&1 &
  echo $! >"$W/$1/pid"
}
stop() { kill -9 "$(cat "$W/$1/pid")" 2>/dev/null || true; sleep 0.2; }
role() { redis-cli -h "$1" info replication | grep -E '^(role|master_host)' | tr -d '\r' | tr '\n' ' '; echo; }
through_haproxy_again() {  # seconds until a write through HAProxy succeeds again
  local t0=$SECONDS
  until [ "$(redis-cli -h 127.0.2.1 info replication 2>/dev/null | grep -c '^role:master')" = 1 ] &&
    redis-cli -h 127.0.2.1 set probe 1 2>/dev/null | grep -q OK; do
    [ $((SECONDS - t0)) -lt 60 ] || { echo "no primary through HAProxy after 60 s"; exit 1; }
    sleep 0.5
  done
  echo "writes through HAProxy again after $((SECONDS - t0)) s"
}

start redis-node-0 redis-node.sh
start redis-node-1 redis-node.sh
sleep 1
for i in 0 1 2; do start "redis-sentinel-$i" sentinel.sh; done
sleep 3
sed -e 's/ resolvers cluster init-addr none//' -e 's/\.${POD_NAMESPACE}\.svc\.${CLUSTER_DOMAIN}//' \
  -e 's/bind :6379/bind 127.0.2.1:6379/' -e '/^resolvers cluster/,/^$/d' \
  "$SRC/haproxy.cfg" >"$W/haproxy.cfg"
haproxy -f "$W/haproxy.cfg" -db >"$W/haproxy.log" 2>&1 &
HAPROXY=$!
sleep 3
echo "== started"
echo "redis-node-0: $(role 127.0.1.1)"
echo "redis-node-1: $(role 127.0.1.2)"
for i in 1 2 3; do
  echo "sentinel $i says: $(redis-cli -h 127.0.1.1$i -p 26379 sentinel get-master-addr-by-name allot | head -1)"
done
redis-cli -h 127.0.2.1 set k written-before >/dev/null
echo "without the password, through HAProxy: $(env -u REDISCLI_AUTH redis-cli -h 127.0.2.1 get k)"
echo "without the password, a Sentinel: $(env -u REDISCLI_AUTH redis-cli -h 127.0.1.11 -p 26379 \
  sentinel get-master-addr-by-name allot)"
echo "== the primary redis-node-0 is killed"
stop redis-node-0
through_haproxy_again
echo "redis-node-1: $(role 127.0.1.2); k = $(redis-cli -h 127.0.2.1 get k)"
echo "== redis-node-0 restarts"
start redis-node-0 redis-node.sh
sleep 4
echo "redis-node-0: $(role 127.0.1.1)"
echo "== redis-sentinel-0 restarts"
stop redis-sentinel-0
start redis-sentinel-0 sentinel.sh
sleep 3
grep monitors "$W/redis-sentinel-0/log"
echo "== the primary redis-node-1 is killed"
stop redis-node-1
through_haproxy_again
echo "redis-node-0: $(role 127.0.1.1); k = $(redis-cli -h 127.0.2.1 get k)"
start redis-node-1 redis-node.sh
sleep 4
echo "redis-node-1 restarted: $(role 127.0.1.2)"
echo "== the primary restarts before the Sentinels notice: it comes back empty"
stop redis-node-0
start redis-node-0 redis-node.sh
sleep 6
echo "redis-node-0: $(role 127.0.1.1)"
echo "redis-node-1: $(role 127.0.1.2)"
echo "k = '$(redis-cli -h 127.0.2.1 get k)' (empty: lost; accounting rebuilds from the log)"
kill "$HAPROXY"
for pod in redis-node-0 redis-node-1 redis-sentinel-0 redis-sentinel-1 redis-sentinel-2; do
  stop "$pod"
done
rm -rf "$W"
