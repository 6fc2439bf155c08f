#!/usr/bin/env bash
# stop-cluster.sh [--purge]: stop what scripts/slurm/start-cluster.sh started, by its pid files.
#
# Safe to call at any time, also when nothing runs or Slurm is not even installed (CI calls it
# in a trap whether the tests passed or not); it exits 0 unless given a bad argument.
#   1. cancels every job (through Slurm) and waits for the queue to drain (15 s at most),
#   2. ends any slurmstepd still listening on a socket in the cluster's spool dirs after that,
#      and its tasks (steps left behind by a slurmd killed in a failure test),
#   3. stops the slurmds and slurmctld, then slurmdbd, then MariaDB and munged, the last two
#      only when start-cluster.sh started them (it leaves their pid files in /run/hpcdl-slurm).
# Every pid is checked against its expected executable (/proc/PID/exe) before it is signalled.
# --purge also drops the accounting database and removes configs, state, logs and the
#         /etc/hosts block, so that the next start is from scratch (packages stay installed).
set -uo pipefail

RUN=/run/hpcdl-slurm
SPOOL=/var/spool/hpcdl-slurm
LOG=/var/log/hpcdl-slurm
ETC=/etc/slurm
DB_NAME=hpcdl_slurm_acct_db
case "${1:-}" in
  --purge) PURGE=1 ;;
  "") PURGE=0 ;;
  *) echo "usage: bash scripts/slurm/stop-cluster.sh [--purge]" >&2; exit 2 ;;
esac

T0=$(date +%s%N)
log() { local ms=$(( ($(date +%s%N) - T0) / 1000000 )); printf '[stop-cluster %3d.%03ds] %s\n' $((ms / 1000)) $((ms % 1000)) "$*"; }
[ "$(id -u)" = 0 ] || { echo "[stop-cluster] ERROR: must run as root" >&2; exit 1; }

exe_of() { readlink -f /proc/"$1"/exe 2>/dev/null; }
alive() {  # pidfile exe
  local pf=$1 exe=$2 pid
  [ -s "$pf" ] || return 1
  pid=$(cat "$pf" 2>/dev/null); [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [ "$(exe_of "$pid")" = "$(readlink -f "$exe")" ]
}
# a zombie (exited, not yet reaped by PID 1) has no /proc/PID/exe: it counts as stopped
running() { readlink /proc/"$1"/exe >/dev/null 2>&1; }
stop_pidfiles() {  # "pidfile|exe|name" ... : SIGTERM them all, wait (20 s at most), then SIGKILL
  local spec pf exe name pid i left
  local -a pids=() names=()
  for spec in "$@"; do
    IFS='|' read -r pf exe name <<<"$spec"
    if alive "$pf" "$exe"; then
      pid=$(cat "$pf"); kill "$pid" 2>/dev/null && { pids+=("$pid"); names+=("$name"); }
    fi
    rm -f "$pf"
  done
  for i in $(seq 1 100); do
    left=0; for pid in "${pids[@]}"; do running "$pid" && left=1; done
    [ $left = 0 ] && break; sleep 0.2
  done
  for i in "${!pids[@]}"; do
    if running "${pids[$i]}"; then
      kill -9 "${pids[$i]}" 2>/dev/null; log "killed ${names[$i]} (${pids[$i]}) with SIGKILL"
    else
      log "stopped ${names[$i]} (${pids[$i]})"
    fi
  done
}
descendants() {  # pid -> all its descendants' pids
  local k
  for k in $(ps -o pid= --ppid "$1" 2>/dev/null); do echo "$k"; descendants "$k"; done
}

# Where slurmctld answers and the nodes' namespaces (start-cluster.sh HPCDL_SLURM_NETWORK=emulated):
# while the emulated cluster still runs, commands go to its head and sockets are read per node.
NETWORK=$(cat "$RUN/network" 2>/dev/null || echo loopback)
CLUSTER_SH="$(dirname "$(readlink -f "$0")")/../cluster/cluster.sh"
[ "$NETWORK" = emulated ] && [ -e /run/netns/hpcdl-head ] || NETWORK=loopback
on_head() { if [ "$NETWORK" = emulated ]; then bash "$CLUSTER_SH" exec head "$@"; else "$@"; fi; }
node_sockets() {  # listening Unix sockets with their pids, of this machine and every node namespace
  ss -xlpn 2>/dev/null
  if [ "$NETWORK" = emulated ]; then
    for ns in /run/netns/hpcdl-h*; do [ -e "$ns" ] && nsenter --net="$ns" ss -xlpn 2>/dev/null; done
  fi
  return 0
}

SLURMD_EXE=$(command -v slurmd || echo /usr/sbin/slurmd)
CTLD_EXE=$(command -v slurmctld || echo /usr/sbin/slurmctld)
STEPD_EXE=$(command -v slurmstepd || echo /usr/sbin/slurmstepd)

# 1. cancel all jobs while the daemons are still up
if alive "$RUN/slurmctld.pid" "$CTLD_EXE"; then
  jobs=$(on_head squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    log "cancelling jobs: $jobs"
    on_head scancel $jobs 2>/dev/null || true
    for _ in $(seq 1 75); do [ -z "$(on_head squeue -h -o %A 2>/dev/null)" ] && break; sleep 0.2; done
  fi
fi

# 2. job steps still alive after that
if [ -d "$SPOOL" ]; then
  for pid in $(node_sockets | awk -v d="$SPOOL/d-" 'index($5, d) == 1' |
               grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do
    [ "$(exe_of "$pid")" = "$(readlink -f "$STEPD_EXE")" ] || continue
    tree=$(descendants "$pid")
    log "ending leftover slurmstepd $pid and its tasks: ${tree//$'\n'/ }"
    kill -9 $tree "$pid" 2>/dev/null || true
  done
fi

# 3. daemons: slurmds + slurmctld, then slurmdbd (stopping it first would make slurmctld's
#    shutdown wait for it), then MariaDB and munged if they are ours
specs=()
for pf in "$RUN"/slurmd-*.pid; do
  [ -e "$pf" ] || continue
  n=${pf#"$RUN"/slurmd-}; specs+=("$pf|$SLURMD_EXE|slurmd ${n%.pid}")
done
stop_pidfiles "${specs[@]}" "$RUN/slurmctld.pid|$CTLD_EXE|slurmctld"
stop_pidfiles "$RUN/slurmdbd.pid|/usr/sbin/slurmdbd|slurmdbd"
if [ "$PURGE" = 1 ] && command -v mariadb >/dev/null && mariadb -e 'select 1' >/dev/null 2>&1; then
  mariadb -e "DROP DATABASE IF EXISTS $DB_NAME" && log "dropped database $DB_NAME"
fi
specs=()
[ -e "$RUN/mariadbd.pid" ] && specs+=("$RUN/mariadbd.pid|/usr/sbin/mariadbd|mariadbd")
[ -e "$RUN/munged.pid" ] && specs+=("$RUN/munged.pid|/usr/sbin/munged|munged")
[ ${#specs[@]} = 0 ] || stop_pidfiles "${specs[@]}"
rm -f /run/mysqld/hpcdl-mariadbd.pid "$RUN/network"

if [ "$PURGE" = 1 ]; then
  rm -rf "$SPOOL" "$LOG" "$RUN" "$ETC/slurm.conf" "$ETC/slurmdbd.conf" "$ETC/hpcdl-task-prolog.sh"
  new_hosts=$(awk '/^# BEGIN hpcdl-slurm/{s=1} !s{print} /^# END hpcdl-slurm/{s=0}' /etc/hosts)
  [ "$new_hosts" = "$(cat /etc/hosts)" ] || printf '%s\n' "$new_hosts" > /etc/hosts
  log "purged state, logs, configs and the /etc/hosts block"
fi
log "done"
exit 0
