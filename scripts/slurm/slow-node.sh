#!/usr/bin/env bash
# slow-node.sh NODE PERCENT | NODE off: plant a slow node in the local Slurm test cluster
# (scripts/slurm/start-cluster.sh), for real: node NODE's processes (its slurmd, the steps
# running there and their tasks: every process in the slurmd's UTS namespace, the node's own
# hostname) are moved into a cgroup whose CPU bandwidth is PERCENT % of one CPU, and every step
# the slurmd starts later inherits it (the cluster runs proctrack/linuxproc and task/none, which
# move nobody). `off` moves them all back and removes the cgroup. This is how `hpcdl diagnose` is tested to name the one slow node (tests/test_diagnose.py).
#
# cgroup v2 (a `cpu` controller in cgroup.controllers): cpu.max = "QUOTA 100000";
# cgroup v1 (a hierarchy mounted with the `cpu` controller): cpu.cfs_quota_us = QUOTA,
# cpu.cfs_period_us = 100000. The cgroup is hpcdl-slow-NODE beside the slurmd's own one.
# Exit 0 done, 1 no usable CPU cgroup here (a container without cgroup rights), 2 bad usage.
set -euo pipefail

RUN=/run/hpcdl-slurm
PERIOD_US=100000
usage() { echo "usage: bash scripts/slurm/slow-node.sh NODE PERCENT(1-100) | NODE off" >&2; exit 2; }
[ $# = 2 ] || usage
NODE=$1 WHAT=$2
[[ "$NODE" =~ ^n[0-9]+$ ]] || usage
[[ "$WHAT" = off || ( "$WHAT" =~ ^[0-9]+$ && "$WHAT" -ge 1 && "$WHAT" -le 100 ) ]] || usage
[ "$(id -u)" = 0 ] || { echo "[slow-node] must run as root" >&2; exit 1; }
PID=$(cat "$RUN/slurmd-$NODE.pid" 2>/dev/null) || { echo "[slow-node] no slurmd $NODE runs" >&2; exit 1; }
[ "$(readlink -f /proc/"$PID"/exe 2>/dev/null)" = "$(readlink -f "$(command -v slurmd)")" ] ||
  { echo "[slow-node] pid $PID of $RUN/slurmd-$NODE.pid is not a slurmd" >&2; exit 1; }

# The CPU hierarchy: its mount point, its version, and the slurmd's cgroup in it.
mounts() {  # FSTYPE: mount point and super options of each mount of that type
  awk -v t="$1" '{for (i = 7; i <= NF; i++) if ($i == "-") break; if ($(i + 1) == t) print $5, $(i + 3)}' /proc/self/mountinfo
}
MNT=$(mounts cgroup | awk '$2 ~ /(^|,)cpu(,|$)/ {print $1; exit}')
if [ -n "$MNT" ]; then
  VER=1; REL=$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ {print $3; exit}' /proc/"$PID"/cgroup)
else
  MNT=$(mounts cgroup2 | awk '{print $1; exit}')
  VER=2; REL=$(awk -F: '$1 == "0" {print $3; exit}' /proc/"$PID"/cgroup)
  [ -n "$MNT" ] && grep -qw cpu "$MNT/cgroup.controllers" 2>/dev/null || MNT=
fi
[ -n "$MNT" ] || { echo "[slow-node] no CPU cgroup controller here (v1 cpu or v2 cpu)" >&2; exit 1; }
case "$(basename "${REL:-/}")" in hpcdl-slow-*) REL=$(dirname "$REL") ;; esac  # already slowed
PARENT="$MNT${REL%/}"
CG="$PARENT/hpcdl-slow-$NODE"

node_pids() {  # the node's processes: those in its slurmd's UTS namespace (slurmstepd is
  local ns p      # reparented to init, so it is not the slurmd's descendant); the slurmd alone
  ns=$(readlink /proc/"$PID"/ns/uts)   # where the nodes share this machine's namespace
  if [ "$ns" = "$(readlink /proc/self/ns/uts)" ]; then echo "$PID"; return; fi
  for p in /proc/[0-9]*; do [ "$(readlink "$p/ns/uts" 2>/dev/null)" = "$ns" ] && echo "${p#/proc/}"; done
  return 0
}
move() {  # cgroup dir: the node's processes into it (one that ended meanwhile is skipped)
  local p; for p in $(node_pids); do echo "$p" > "$1/cgroup.procs" 2>/dev/null || true; done
}

if [ "$WHAT" = off ]; then
  [ -d "$CG" ] || exit 0
  move "$PARENT"
  # steps that ended may take a moment to leave; a step still running keeps the cgroup
  for _ in $(seq 1 50); do rmdir "$CG" 2>/dev/null && exit 0; sleep 0.1; done
  echo "[slow-node] $CG still holds: $(cat "$CG/cgroup.procs" | tr '\n' ' ')" >&2; exit 1
fi

QUOTA=$(( PERIOD_US * WHAT / 100 ))
if [ "$VER" = 2 ]; then
  grep -qw cpu "$PARENT/cgroup.subtree_control" || echo +cpu > "$PARENT/cgroup.subtree_control"
  mkdir -p "$CG"; echo "$QUOTA $PERIOD_US" > "$CG/cpu.max"
else
  mkdir -p "$CG"; echo "$PERIOD_US" > "$CG/cpu.cfs_period_us"; echo "$QUOTA" > "$CG/cpu.cfs_quota_us"
fi
move "$CG"
echo "[slow-node] node $NODE (slurmd $PID, $(wc -l <"$CG/cgroup.procs") processes): $WHAT % of one CPU ($CG)"
