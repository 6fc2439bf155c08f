# Sourced by start-cluster.sh: inherit_nothing CMD... runs CMD with no open descriptor but
# stdin, stdout and stderr. A daemon keeps every descriptor it inherits for as long as it runs:
# started from a script that held a lock (`flock LOCK bash start-cluster.sh`), the daemons held
# the lock until the cluster stopped. Closed in a subshell, so that this script keeps its own.
inherit_nothing() {
  (
    local fd
    for fd in /proc/"$BASHPID"/fd/*; do
      fd=${fd##*/}
      if [ "$fd" -gt 2 ]; then eval "exec $fd>&-"; fi
    done
    "$@"  # a command or a function (on_head): either way with none of those descriptors
  )
}
