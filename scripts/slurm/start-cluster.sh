#!/usr/bin/env bash
# start-cluster.sh [NODES]: a real Slurm cluster of NODES "nodes" (default 4) on this one host,
# for hpcdl's tests and CI. Debian 12, as root. Stop it with scripts/slurm/stop-cluster.sh.
#
# Idempotent: installs missing packages, (re)writes the configs, starts only the daemons that
# are not running (restarting slurmctld and the slurmds when the generated slurm.conf changed,
# e.g. for another node count), then waits until every node is idle.
#
# What runs:
#   munged                  authentication (key created once in /etc/munge/munge.key)
#   MariaDB + slurmdbd      accounting, so that `sacct` works: submitit polls job states with
#                           sacct, and without it a cancelled job is never seen to end
#   slurmctld               the controller
#   slurmd x NODES          Debian's slurmd is built with multiple-slurmd support, so NODES of
#                           them run side by side as `slurmd -N nI`, each with its own port,
#                           spool dir, TmpFS, pid file and log, and each in its own UTS
#                           namespace (`unshare --uts`) so that `hostname` in a job says nI.
#                           nI resolves to 127.0.0.(10+I) through a marked block in /etc/hosts;
#                           all traffic stays on loopback.
#
# With HPCDL_SLURM_NETWORK=emulated, the nodes are hosts of the emulated cluster instead
# (scripts/cluster/cluster.sh start, at least NODES hosts, must run): slurmd nI runs in host hI's
# network namespace at 10.231.0.I, so a job's traffic between nodes crosses the rate-limited
# links; slurmctld and slurmdbd run on the cluster's head (10.231.0.254), as on a real cluster's
# management node. Commands that talk to them from this machine (sbatch, squeue, sacct, ...)
# must then run on the head: scripts/slurm/client/ holds one such wrapper per command, to put
# first on PATH. MariaDB and munged stay here (Unix sockets reach every namespace).
#
# Settings below that each fixed a failure seen on such a machine (2 cores, no systemd, no cgroups):
#   ProctrackType=proctrack/linuxproc, TaskPlugin=task/none   no cgroups here
#   TmpFS=<spool>/tmp-%n      else PMIx fails: 'pmixp_mkdir: Cannot create directory
#                             "/tmp/spmix_appdir_...": File exists' (nodes would share /tmp)
#   TaskProlog                exports OMPI_MCA_{btl,oob}_tcp_if_include=lo and
#                             OMPI_ALLOW_RUN_AS_ROOT{,_CONFIRM}=1: else Open MPI uses eth0, or
#                             refuses to run as root
#   batch_sched_delay=0       a trivial submitit round trip takes ~1 s instead of ~3 s
#   MpiDefault=pmix           a plain `srun python ...` is an MPI job (PMIx v4)
#   no CommunicationParameters=NoInAddrAny: with it, srun inside a batch job hangs
#                             ('connect io: Connection refused')
#   stale stepd.slurm.pmix.* sockets of dead steps are removed before a slurmd starts: else a
#                             requeued job fails with 'Address already in use'
#
# Environment:
#   HPCDL_SLURM_PORT_BASE=17000   node nI's slurmd listens on PORT_BASE+I
#   HPCDL_SLURM_TIMEOUT=90        seconds to wait for the nodes to become idle
#   HPCDL_SLURM_NETWORK=loopback  or emulated (above)
set -euo pipefail

NODES="${1:-4}"
PORT_BASE="${HPCDL_SLURM_PORT_BASE:-17000}"
TIMEOUT="${HPCDL_SLURM_TIMEOUT:-90}"
CLUSTER=hpcdl
RUN=/run/hpcdl-slurm
SPOOL=/var/spool/hpcdl-slurm
LOG=/var/log/hpcdl-slurm
ETC=/etc/slurm
CONF=$ETC/slurm.conf
DBDCONF=$ETC/slurmdbd.conf
PROLOG=$ETC/hpcdl-task-prolog.sh
DB_NAME=hpcdl_slurm_acct_db
NETWORK="${HPCDL_SLURM_NETWORK:-loopback}"
CLUSTER_SH="$(dirname "$(readlink -f "$0")")/../cluster/cluster.sh"
# every daemon below starts through inherit_nothing: it keeps no descriptor this script inherited
. "$(dirname "$(readlink -f "$0")")/inherit-nothing.sh"

T0=$(date +%s%N)
log() { local ms=$(( ($(date +%s%N) - T0) / 1000000 )); printf '[start-cluster %3d.%03ds] %s\n' $((ms / 1000)) $((ms % 1000)) "$*"; }
die() { echo "[start-cluster] ERROR: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root"
[[ "$NODES" =~ ^[0-9]+$ ]] && [ "$NODES" -ge 1 ] && [ "$NODES" -le 64 ] || die "NODES must be 1..64 (got '$NODES')"
case "$NETWORK" in
  loopback) CTLD_ADDR=127.0.0.1; node_addr() { echo "127.0.0.$((10 + $1))"; }; IF_INCLUDE=lo ;;
  emulated)
    [ -s /run/hpcdl-cluster/config ] && bash "$CLUSTER_SH" status >/dev/null ||
      die "HPCDL_SLURM_NETWORK=emulated: no emulated cluster runs (bash scripts/cluster/cluster.sh start $NODES)"
    read -r EMU_HOSTS _ EMU_NET </run/hpcdl-cluster/config
    [ "$EMU_HOSTS" -ge "$NODES" ] || die "the emulated cluster has $EMU_HOSTS hosts, fewer than NODES=$NODES"
    CTLD_ADDR=$EMU_NET.254; node_addr() { echo "$EMU_NET.$1"; }; IF_INCLUDE=$EMU_NET.0/24 ;;
  *) die "HPCDL_SLURM_NETWORK='$NETWORK' is invalid: loopback or emulated" ;;
esac
# on_head CMD...: run CMD where slurmctld and slurmdbd live (the emulated cluster's head, or here)
on_head() { if [ "$NETWORK" = emulated ]; then bash "$CLUSTER_SH" exec head "$@"; else "$@"; fi; }
# in_node I CMD...: run CMD in node nI's network namespace (Unix sockets are seen per namespace)
in_node() { local i=$1; shift; if [ "$NETWORK" = emulated ]; then nsenter --net="/run/netns/hpcdl-h$i" "$@"; else "$@"; fi; }

# ---------------------------------------------------------------- packages
need=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server iproute2)
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  # No systemd here: keep the packages' postinst scripts from starting daemons we would not track.
  made_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; made_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/hpcdl-slurm-apt.log 2>&1 || {
    apt-get update -q >>/tmp/hpcdl-slurm-apt.log 2>&1
    apt-get install -y -q --no-install-recommends "${missing[@]}" >>/tmp/hpcdl-slurm-apt.log 2>&1 ||
      { tail -20 /tmp/hpcdl-slurm-apt.log >&2; die "apt-get install failed (log: /tmp/hpcdl-slurm-apt.log)"; }
  }
  [ "$made_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
fi
log "packages ok ($(slurmd -V))"

# pid file + expected executable -> alive, and really that program (not a recycled pid)?
alive() {
  local pf=$1 exe=$2 pid
  [ -s "$pf" ] || return 1
  pid=$(cat "$pf" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [ "$(readlink -f /proc/"$pid"/exe 2>/dev/null)" = "$(readlink -f "$exe")" ]
}
# a zombie (exited, not yet reaped by PID 1) has no /proc/PID/exe: it counts as stopped
running() { readlink /proc/"$1"/exe >/dev/null 2>&1; }
stop_pidfiles() {  # pidfile exe [pidfile exe ...]: SIGTERM all, wait for all (20 s), then SIGKILL
  local pid i left pids=()
  while [ $# -ge 2 ]; do
    if alive "$1" "$2"; then pid=$(cat "$1"); kill "$pid" 2>/dev/null && pids+=("$pid"); fi
    rm -f "$1"; shift 2
  done
  for i in $(seq 1 100); do
    left=0; for pid in "${pids[@]}"; do running "$pid" && left=1; done
    [ $left = 0 ] && return 0; sleep 0.2
  done
  for pid in "${pids[@]}"; do running "$pid" && kill -9 "$pid" 2>/dev/null; done; return 0
}
wait_for() {  # seconds command... : until the command succeeds (0.2 s polls), else return 1
  local end=$(( $(date +%s) + $1 )); shift
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || return 1
    sleep 0.2
  done
}

mkdir -p "$RUN" "$SPOOL/ctld" "$LOG" "$ETC"

# ---------------------------------------------------------------- /etc/hosts block
new_hosts=$(
  awk '/^# BEGIN hpcdl-slurm/{s=1} !s{print} /^# END hpcdl-slurm/{s=0}' /etc/hosts
  echo "# BEGIN hpcdl-slurm (scripts/slurm/start-cluster.sh)"
  for i in $(seq 1 "$NODES"); do echo "$(node_addr "$i") n$i"; done
  echo "# END hpcdl-slurm"
)
# rewrite in place, not by rename: /etc/hosts may be a bind mount
[ "$new_hosts" = "$(cat /etc/hosts)" ] || printf '%s\n' "$new_hosts" > /etc/hosts

# ---------------------------------------------------------------- munge
if [ ! -s /etc/munge/munge.key ]; then
  mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null ||
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "munged already running"
else
  rm -f "$RUN/munged.pid"
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
  inherit_nothing runuser -u munge -- /usr/sbin/munged </dev/null >/dev/null 2>&1
  wait_for 10 sh -c 'munge -n | unmunge' || die "munged did not start (see /var/log/munge/munged.log)"
  cp /run/munge/munged.pid "$RUN/munged.pid"   # marks it as ours, for stop-cluster.sh
  log "munged started (pid $(cat "$RUN/munged.pid"))"
fi

# ---------------------------------------------------------------- slurm.conf + TaskProlog
HW=$(slurmd -C | sed -n 1p)   # this host's CPUs/sockets/cores/threads/memory, as slurmd sees them
hw() { sed -n "s/.*\b$1=\([0-9]*\).*/\1/p" <<<"$HW"; }
NODE_HW="CPUs=$(hw CPUs) Boards=$(hw Boards) SocketsPerBoard=$(hw SocketsPerBoard) CoresPerSocket=$(hw CoresPerSocket) ThreadsPerCore=$(hw ThreadsPerCore)"
NODE_MEM=$(( $(hw RealMemory) * 9 / 10 / NODES )); [ "$NODE_MEM" -ge 100 ] || NODE_MEM=100

NEWCONF=$(cat <<EOF
# Generated by scripts/slurm/start-cluster.sh: a $NODES-node test cluster on one host ($NETWORK network). Do not edit.
ClusterName=$CLUSTER
SlurmctldHost=$(on_head hostname -s)($CTLD_ADDR)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$SPOOL/ctld
SlurmdSpoolDir=$SPOOL/d-%n
TmpFS=$SPOOL/tmp-%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog=$PROLOG
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SwitchType=switch/none
MpiDefault=pmix
ReturnToService=2
SlurmdTimeout=30
KillWait=5
InactiveLimit=0
MinJobAge=300
MailProg=/bin/true
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG/jobcomp.txt
$(for i in $(seq 1 "$NODES"); do
  echo "NodeName=n$i NodeHostname=n$i NodeAddr=$(node_addr "$i") Port=$((PORT_BASE + i)) $NODE_HW RealMemory=$NODE_MEM State=UNKNOWN"
done)
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
)
conf_changed=0
if [ "$NEWCONF" != "$(cat "$CONF" 2>/dev/null)" ]; then
  conf_changed=1
  printf '%s\n' "$NEWCONF" > "$CONF.tmp.$$" && mv "$CONF.tmp.$$" "$CONF"
fi
chmod 644 "$CONF"

cat > "$PROLOG.tmp.$$" <<EOF
#!/bin/sh
# Slurm TaskProlog (scripts/slurm/start-cluster.sh): each "export K=V" line is added to the
# environment of every task, batch scripts included. Keep Open MPI's TCP traffic on the nodes'
# network ($NETWORK: $IF_INCLUDE), and let Open MPI run as root (CI runs jobs as root).
echo "export OMPI_MCA_btl_tcp_if_include=$IF_INCLUDE"
echo "export OMPI_MCA_oob_tcp_if_include=$IF_INCLUDE"
echo "export OMPI_ALLOW_RUN_AS_ROOT=1"
echo "export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
EOF
chmod 755 "$PROLOG.tmp.$$"; mv "$PROLOG.tmp.$$" "$PROLOG"
log "slurm.conf $( [ $conf_changed = 1 ] && echo written || echo unchanged ): $NODES nodes ($NODE_HW RealMemory=$NODE_MEM)"

# ---------------------------------------------------------------- MariaDB + slurmdbd
if mariadb -e 'select 1' >/dev/null 2>&1; then
  log "MariaDB already running"
else
  rm -f "$RUN/mariadbd.pid"
  [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >"$LOG/mariadb-install-db.log" 2>&1
  install -d -o mysql -g mysql /run/mysqld "$LOG/mysql"
  rm -f /run/mysqld/hpcdl-mariadbd.pid
  # Unix socket only (/run/mysqld/mysqld.sock); root connects through unix_socket auth.
  inherit_nothing setsid /usr/sbin/mariadbd --user=mysql --skip-networking --innodb-lock-wait-timeout=900 \
    --pid-file=/run/mysqld/hpcdl-mariadbd.pid --log-error="$LOG/mysql/mariadbd.log" \
    </dev/null >/dev/null 2>&1 &
  wait_for 60 mariadb -e 'select 1' || die "MariaDB did not start (see $LOG/mysql/mariadbd.log)"
  wait_for 10 test -s /run/mysqld/hpcdl-mariadbd.pid
  cp /run/mysqld/hpcdl-mariadbd.pid "$RUN/mariadbd.pid"   # marks it as ours
  log "mariadbd started (pid $(cat "$RUN/mariadbd.pid"))"
fi

NEWDBD=$(cat <<EOF
# Generated by scripts/slurm/start-cluster.sh ($NETWORK network: slurmdbd runs beside slurmctld). Do not edit.
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=$DB_NAME
EOF
)
if [ "$NEWDBD" != "$(cat "$DBDCONF" 2>/dev/null)" ]; then
  printf '%s\n' "$NEWDBD" > "$DBDCONF"; stop_pidfiles "$RUN/slurmdbd.pid" /usr/sbin/slurmdbd
fi
chmod 600 "$DBDCONF"
if ! alive "$RUN/slurmdbd.pid" /usr/sbin/slurmdbd; then
  inherit_nothing on_head slurmdbd </dev/null >/dev/null 2>&1
  log "slurmdbd started (pid $(cat "$RUN/slurmdbd.pid" 2>/dev/null))"
fi
wait_for 60 on_head sacctmgr -n list cluster || die "slurmdbd not answering (see $LOG/slurmdbd.log)"

# ---------------------------------------------------------------- slurmctld + slurmds
CTLD_EXE=$(command -v slurmctld); SLURMD_EXE=$(command -v slurmd)
# Running daemons that must restart: all of them when the config changed, else only the
# slurmds of nodes no longer in it.
stop=()
for pf in "$RUN"/slurmd-*.pid; do
  [ -e "$pf" ] || continue
  n=${pf#"$RUN"/slurmd-}; n=${n%.pid}
  if [ $conf_changed = 1 ] || ! grep -q "^NodeName=$n " "$CONF"; then
    alive "$pf" "$SLURMD_EXE" && stop+=("$pf" "$SLURMD_EXE")
  fi
done
[ $conf_changed = 1 ] && alive "$RUN/slurmctld.pid" "$CTLD_EXE" && stop+=("$RUN/slurmctld.pid" "$CTLD_EXE")
[ ${#stop[@]} = 0 ] || { stop_pidfiles "${stop[@]}"; log "stopped $(( ${#stop[@]} / 2 )) slurm daemon(s) to apply the new config"; }

if ! alive "$RUN/slurmctld.pid" "$CTLD_EXE"; then
  inherit_nothing on_head slurmctld </dev/null >/dev/null 2>&1
  log "slurmctld started (pid $(cat "$RUN/slurmctld.pid" 2>/dev/null))"
fi
wait_for 30 on_head scontrol ping || die "slurmctld not answering (see $LOG/slurmctld.log)"

# PMIx leftovers of steps whose slurmstepd died without cleaning up (a node "crash" in a test):
# a requeued job reuses its job and step ids, and its step would fail with
# "pmixp_usock_create_srv: Cannot bind() UNIX socket .../stepd.slurm.pmix.J.S: Address already in use".
# A socket still listened on belongs to a live step and stays.
clean_stale_pmix() {  # node
  local n=$1 f id live
  live=$(in_node "${n#n}" ss -xlpn 2>/dev/null | awk -v d="$SPOOL/d-$n/" 'index($5, d) == 1 {print $5}')
  for f in "$SPOOL/d-$n"/stepd.slurm.pmix.*; do
    [ -e "$f" ] || continue
    id=${f##*/stepd.slurm.pmix.}
    grep -qx "$SPOOL/d-$n/${n}_$id" <<<"$live" && continue
    rm -rf "$f" "$SPOOL/d-$n/pmix.$id" "$SPOOL/tmp-$n"/spmix_appdir_*_"$id"
  done
}

UTS=1; unshare --uts true 2>/dev/null || UTS=0
for i in $(seq 1 "$NODES"); do
  n=n$i
  mkdir -p "$SPOOL/d-$n" "$SPOOL/tmp-$n"
  alive "$RUN/slurmd-$n.pid" "$SLURMD_EXE" && continue
  clean_stale_pmix "$n"
  if [ "$NETWORK" = emulated ]; then
    # host hI's network, a UTS namespace named nI, and the host's resolv.conf (no DNS server on the
    # emulated network: lookups fail at once) in a mount namespace of its own; /etc/hosts stays
    # the machine's, where the block above names the nodes
    inherit_nothing nsenter --net="/run/netns/hpcdl-h$i" unshare --uts --mount sh -c \
      "mount --bind /etc/netns/hpcdl-h$i/resolv.conf /etc/resolv.conf && hostname $n && exec slurmd -N $n" \
      </dev/null >/dev/null 2>&1
  elif [ $UTS = 1 ]; then   # own hostname per node; the network (loopback) is shared
    inherit_nothing unshare --uts sh -c "hostname $n && exec slurmd -N $n" </dev/null >/dev/null 2>&1
  else
    inherit_nothing slurmd -N "$n" </dev/null >/dev/null 2>&1
  fi
done
[ $UTS = 1 ] || log "WARNING: unshare --uts not permitted: every node reports this host's name"

# ---------------------------------------------------------------- wait for idle nodes
all_ready() {
  local out bad
  out=$(on_head sinfo -h -N -p debug -o '%N %t') || return 1
  [ "$(wc -l <<<"$out")" -eq "$NODES" ] || return 1
  # resume nodes that came back down/drained from saved state (e.g. a test set them down)
  bad=$(awk '$2 ~ /^(down|drain|drng|drained|fail)$/ {print $1}' <<<"$out" | paste -sd, -)
  [ -z "$bad" ] || on_head scontrol update NodeName="$bad" State=RESUME >/dev/null 2>&1 || true
  awk '$2 !~ /^(idle|mix|alloc)$/ {bad = 1} END {exit bad}' <<<"$out"
}
if ! wait_for "$TIMEOUT" all_ready; then
  on_head sinfo -N -l >&2 || true
  for i in $(seq 1 "$NODES"); do tail -n 5 "$LOG/slurmd-n$i.log" >&2 2>/dev/null || true; done
  die "nodes not idle after ${TIMEOUT}s"
fi
echo "$NETWORK" >"$RUN/network"   # for stop-cluster.sh: where slurmctld answers
log "cluster ready ($NETWORK network):"
on_head sinfo -N -o '%N %P %t %c %m'
