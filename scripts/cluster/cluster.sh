#!/usr/bin/env bash
# cluster.sh: an emulated cluster on this one machine, with a real, rate-limited network.
#
#   bash scripts/cluster/cluster.sh start [HOSTS] [RATE]   HOSTS hosts (default 4), each link at RATE
#                                                          (tc syntax, default 200mbit)
#   bash scripts/cluster/cluster.sh stop                   tear down everything start made
#   bash scripts/cluster/cluster.sh status                 what runs (exit 1 when nothing does)
#   bash scripts/cluster/cluster.sh exec HOST CMD...       run CMD on host HOST (h1 ... hN, head)
#
# What it makes (as root; Linux network namespaces, iproute2 and util-linux only):
#   hpcdl-sw             a network namespace holding the switch: a bridge, br0
#   hpcdl-h1 ... -hN     one network namespace per host, with lo and eth0, a veth whose other
#                        end (pI) is a port of br0; eth0 has 10.231.0.I/24 (HPCDL_CLUSTER_NET)
#   hpcdl-head           the cluster's head (login) node at 10.231.0.254, on port p0 of the
#                        switch, its link not limited: where a scheduler's controller runs
#                        (scripts/slurm/start-cluster.sh with HPCDL_SLURM_NETWORK=emulated)
#   a UTS namespace      per host (bind-mounted on $STATE/uts/hI): `hostname` there says hI,
#                        so MPI tells the hosts apart; the machine's own name is untouched
#   /etc/netns/hpcdl-hI/hosts  the hosts file `ip netns exec` shows inside host hI: every
#                        emulated host by name; the machine's /etc/hosts is untouched
#   /etc/netns/*/resolv.conf   no DNS server inside (lookups that miss the hosts file fail fast)
#   tbf qdiscs           on eth0 (what the host sends) and on pI (what it receives): each host
#                        has a link of RATE in each direction, as with one NIC per node.
#                        netem is not in this kernel: the latency is what the veth path gives.
# Inside a host, processes talk through loopback or shared memory, at full speed; between
# hosts every byte crosses two rate-limited veths and the bridge. The addresses exist only
# inside these namespaces; the machine's own interfaces and routes are never touched.
#
# Idempotent: start with the same HOSTS and RATE while the cluster runs does nothing; with
# others, it rebuilds the cluster. A start that fails half-way tears down what it made, and
# start first removes the leftovers of a cluster that was never stopped. stop also ends every
# process still inside a host (stray MPI ranks) and says so when no cluster runs.
set -euo pipefail

NET="${HPCDL_CLUSTER_NET:-10.231.0}"
STATE=/run/hpcdl-cluster
PREFIX=hpcdl-
SWITCH=${PREFIX}sw

log() { echo "[cluster] $*"; }
die() { echo "[cluster] ERROR: $*" >&2; exit 1; }
bad() { echo "[cluster] $*" >&2; exit 2; }   # bad input: one line, exit 2, nothing made
usage() { sed -n '4,7s/^# \{0,1\}//p' "$0" >&2; exit 2; }

host_ns() { echo "${PREFIX}$1"; }   # h3 -> hpcdl-h3

# namespaces this script made, by name (whatever state file says: leftovers of a crash too)
our_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep "^${PREFIX}\(sw\|head\|h[0-9]\+\)$" || true; }

teardown() {
  local ns pids hosts=0 f
  for ns in $(our_namespaces); do
    # stray processes (ranks, orteds) still inside a host: a namespace lives on while they do
    pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    if [ -n "${pids// /}" ]; then
      log "ending processes left in $ns: $pids" >&2
      kill -9 $pids 2>/dev/null || true
    fi
    ip netns del "$ns" 2>/dev/null || true   # takes its veth ends and their qdiscs with it
    if [[ "$ns" =~ ^${PREFIX}h[0-9]+$ ]]; then hosts=$((hosts + 1)); fi
  done
  if [ -d "$STATE/uts" ]; then
    for f in "$STATE"/uts/*; do
      [ -e "$f" ] || continue
      umount "$f" 2>/dev/null || true
      rm -f "$f"
    done
  fi
  rm -rf "$STATE" /etc/netns/${PREFIX}h* /etc/netns/${PREFIX}head
  rmdir /etc/netns 2>/dev/null || true
  echo "$hosts"
}

running_config() {  # "HOSTS RATE NET" of a complete running cluster, else nothing
  [ -s "$STATE/config" ] || return 0
  local hosts rate net i
  read -r hosts rate net <"$STATE/config"
  ip netns list | grep -q "^$SWITCH\b" || return 0
  ip netns list | grep -q "^$(host_ns head)\b" && [ -e "$STATE/uts/head" ] || return 0
  for i in $(seq 1 "$hosts"); do
    ip netns list | grep -q "^$(host_ns h"$i")\b" || return 0
    [ -e "$STATE/uts/h$i" ] || return 0
  done
  echo "$hosts $rate $net"
}

burst_of() {  # the token bucket's depth: 2 ms at RATE, but at least 64 KiB (one GSO segment)
  local bits=$1
  echo $(( bits / 8 / 500 > 65536 ? bits / 8 / 500 : 65536 ))
}

rate_bits() {  # 200mbit -> 200000000 (tc's units: bit, kbit, mbit, gbit)
  local r=$1 n u
  [[ "$r" =~ ^([0-9]{1,12})(bit|kbit|mbit|gbit)$ ]] || return 1
  n=${BASH_REMATCH[1]}; u=${BASH_REMATCH[2]}
  case $u in bit) echo "$n" ;; kbit) echo $((n * 1000)) ;; mbit) echo $((n * 1000000)) ;; gbit) echo $((n * 1000000000)) ;; esac
}

start() {
  local hosts=${1:-4} rate=${2:-200mbit} bits burst cur i h ns
  [[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le 200 ] ||
    bad "HOSTS='$hosts' is invalid: an integer 1..200"
  bits=$(rate_bits "$rate") && [ "$bits" -ge 1000000 ] && [ "$bits" -le 400000000000 ] ||
    bad "RATE='$rate' is invalid: 1mbit to 400gbit, in bit, kbit, mbit or gbit (e.g. 200mbit)"
  [[ "$NET" =~ ^(10|192\.168|172\.(1[6-9]|2[0-9]|3[01]))(\.[0-9]+){0,2}$ ]] && [ "$(tr -cd . <<<"$NET" | wc -c)" = 2 ] ||
    bad "HPCDL_CLUSTER_NET='$NET' is invalid: the first three parts of a private IPv4 /24 (e.g. 10.231.0)"
  cur=$(running_config)
  if [ "$cur" = "$hosts $rate $NET" ]; then
    log "already running: $hosts hosts at $rate on $NET.0/24 (nothing to do)"
    return 0
  fi
  if [ -n "$cur" ]; then
    log "a cluster of another shape runs ($cur): rebuilding"
  fi
  if [ -n "$(our_namespaces)" ] || [ -e "$STATE" ]; then
    log "removing a previous or half-started cluster ($(teardown) hosts)"
  fi
  burst=$(burst_of "$bits")
  # from here on, a failure tears down whatever was made
  trap 'echo "[cluster] ERROR: start failed at line $LINENO; tearing down" >&2; teardown >/dev/null; exit 1' ERR
  mkdir -p "$STATE/uts" /etc/netns
  ip netns add "$SWITCH"
  ip -n "$SWITCH" link add br0 type bridge
  ip -n "$SWITCH" link set br0 up
  for i in $(seq 1 "$hosts"); do
    h=h$i; ns=$(host_ns $h)
    ip netns add "$ns"
    ip -n "$SWITCH" link add "p$i" type veth peer name eth0 netns "$ns"
    ip -n "$SWITCH" link set "p$i" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$NET.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" route add default dev eth0   # so "the address of the default route" is eth0's
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 50ms
    ip netns exec "$SWITCH" tc qdisc add dev "p$i" root tbf rate "$rate" burst "$burst" latency 50ms
    touch "$STATE/uts/$h"
    unshare --uts="$STATE/uts/$h" hostname "$h"
  done
  # the head: no hosts file of its own (it sees the machine's, where a scheduler names its nodes)
  ns=$(host_ns head)
  ip netns add "$ns"
  ip -n "$SWITCH" link add p0 type veth peer name eth0 netns "$ns"
  ip -n "$SWITCH" link set p0 master br0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$NET.254/24" dev eth0
  ip -n "$ns" link set eth0 up
  touch "$STATE/uts/head"
  unshare --uts="$STATE/uts/head" hostname head
  for i in $(seq 1 "$hosts"); do
    mkdir -p "/etc/netns/$(host_ns h"$i")"
    {
      echo "127.0.0.1 localhost"
      echo "# the emulated cluster (scripts/cluster/cluster.sh)"
      for j in $(seq 1 "$hosts"); do echo "$NET.$j h$j"; done
      echo "$NET.254 head"
    } >"/etc/netns/$(host_ns h"$i")/hosts"
  done
  # no DNS on the emulated network: a lookup that misses the hosts file fails at once instead of
  # waiting for a server it cannot reach (c10d's reverse lookups took 6 s a run before this)
  for ns in $(for i in $(seq 1 "$hosts"); do host_ns h"$i"; done) "$(host_ns head)"; do
    mkdir -p "/etc/netns/$ns"
    printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"/etc/netns/$ns/resolv.conf"
  done
  for i in $(seq 1 "$hosts"); do echo "h$i slots=1"; done >"$STATE/hostfile"
  echo "$hosts $rate $NET" >"$STATE/config"
  trap - ERR
  log "started: $hosts hosts (h1 ... h$hosts, $NET.1 ...) on a bridge, each link at $rate (tbf, burst $burst B); head at $NET.254"
}

stop() {
  local n
  if [ -z "$(our_namespaces)" ] && [ ! -e "$STATE" ]; then
    log "no emulated cluster runs (nothing to stop)"
    return 0
  fi
  n=$(teardown)
  log "stopped: $n hosts, the switch, their links, qdiscs, UTS namespaces and hosts files removed"
}

status() {
  local cur
  cur=$(running_config)
  [ -n "$cur" ] || { log "no emulated cluster runs"; return 1; }
  read -r hosts rate net <<<"$cur"
  log "running: $hosts hosts at $rate on $net.0/24; hostfile $STATE/hostfile"
}

exec_on() {  # HOST CMD...: CMD in the host's UTS and network namespaces, with its hosts file
  local h=${1:-}; shift || true
  [[ "$h" =~ ^(h[0-9]+|head)$ ]] && [ -e "$STATE/uts/$h" ] || die "no emulated host '$h' (running: $(running_config))"
  [ $# -ge 1 ] || die "exec $h: no command given"
  exec nsenter --uts="$STATE/uts/$h" ip netns exec "$(host_ns "$h")" "$@"
}

[ "$(id -u)" = 0 ] || die "must run as root (network namespaces)"
verb=${1:-}; shift || true
case "$verb" in
  start) [ $# -le 2 ] || usage; start "$@" ;;
  stop) [ $# = 0 ] || usage; stop ;;
  status) [ $# = 0 ] || usage; status ;;
  exec) exec_on "$@" ;;
  *) usage ;;
esac
