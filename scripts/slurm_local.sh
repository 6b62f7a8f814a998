#!/usr/bin/env bash
# A throw-away SLURM cluster on this machine, for tests/e2e_slurm.sh and for
# trying `tilewise submit` without a real cluster.
#
#   scripts/slurm_local.sh start STATE_DIR   # install (as root) and start munged, slurmctld, slurmd
#   scripts/slurm_local.sh stop STATE_DIR    # stop the daemons started with that STATE_DIR
#
# Everything lives under STATE_DIR: slurm.conf, the munge key and socket,
# state, spool, pid files and logs; the ports are free ones picked at start.
# The system's own munge/SLURM configuration is neither read nor changed.
# Clients find the cluster through SLURM_CONF: after `start`, run
#   export SLURM_CONF=STATE_DIR/slurm.conf
#
# Exit codes of `start`: 0 started (the node is idle and takes jobs),
# 77 cannot start here (not root, packages cannot be installed, a daemon
# fails: the reason on stderr, the daemons it did start are stopped again),
# 2 usage. The single node is this host with 2 CPUs; one partition "tw".
set -uo pipefail

say() { echo "slurm_local: $*" >&2; }

usage() {
  echo "usage: $0 start|stop STATE_DIR" >&2
  exit 2
}

[ $# -eq 2 ] || usage
cmd=$1
state=$2
case "$state" in /*) ;; *) state="$PWD/$state" ;; esac

# Stop one daemon by its pid file: TERM, up to 10 s, then KILL.
stop_pidfile() {
  local f=$1 pid
  [ -s "$f" ] || return 0
  pid=$(cat "$f" 2>/dev/null) || return 0
  case "$pid" in '' | *[!0-9]*) return 0 ;; esac
  kill -TERM "$pid" 2>/dev/null || { rm -f "$f"; return 0; }
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null
  rm -f "$f"
}

do_stop() {
  # slurmd first: it would otherwise keep retrying the controller.
  stop_pidfile "$state/slurmd.pid"
  stop_pidfile "$state/slurmctld.pid"
  stop_pidfile "$state/munged.pid"
}

# From here on, a failure stops what was started and means "skip".
give_up() {
  say "$*"
  for log in slurmctld.log slurmd.log munged.log; do
    [ -s "$state/$log" ] && { say "last lines of $log:"; tail -n 5 "$state/$log" >&2; }
  done
  do_stop
  exit 77
}

have_all() {
  command -v munged >/dev/null && command -v slurmctld >/dev/null &&
    command -v slurmd >/dev/null && command -v sbatch >/dev/null &&
    command -v squeue >/dev/null && command -v scontrol >/dev/null
}

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

do_start() {
  if [ "$(id -u)" -ne 0 ]; then
    say "not root: a local SLURM (munged, slurmctld, slurmd as root) cannot be started"
    exit 77
  fi
  if ! have_all; then
    say "installing slurm-wlm and munge with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge \
      >"${TMPDIR:-/tmp}/slurm_local_apt.$$.log" 2>&1 ||
      { tail -n 5 "${TMPDIR:-/tmp}/slurm_local_apt.$$.log" >&2; say "apt-get install slurm-wlm munge failed"; exit 77; }
    have_all || { say "slurm-wlm installed but its programs are not on PATH"; exit 77; }
  fi
  if [ -s "$state/slurmctld.pid" ] && kill -0 "$(cat "$state/slurmctld.pid")" 2>/dev/null; then
    say "already running in $state (stop it first)"
    exit 77
  fi

  mkdir -p "$state"/{ctld,spool,munge} || { say "cannot create $state"; exit 77; }
  chmod 700 "$state" "$state/munge"

  # munge: a private daemon with its own key and socket.
  local key="$state/munge/munge.key" sock="$state/munge/munge.socket"
  head -c 1024 /dev/urandom >"$key" && chmod 400 "$key" || give_up "cannot write the munge key"
  munged --force --socket="$sock" --key-file="$key" --pid-file="$state/munged.pid" \
    --log-file="$state/munged.log" --seed-file="$state/munge/seed" ||
    give_up "munged did not start"

  local host mem_mb ctld_port d_port
  host=$(hostname -s)
  mem_mb=$(awk '/MemTotal/ { print int($2 / 1024 / 2) }' /proc/meminfo)
  ctld_port=$(free_port) && d_port=$(free_port) || give_up "cannot find free ports"
  while [ "$d_port" = "$ctld_port" ]; do d_port=$(free_port); done

  cat >"$state/slurm.conf" <<EOF
# Written by scripts/slurm_local.sh: a one-node cluster for tests.
ClusterName=twlocal
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock
CredType=cred/munge
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/builtin
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
MinJobAge=600
DefMemPerCPU=256
SchedulerParameters=sched_interval=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=2 RealMemory=$mem_mb State=UNKNOWN
PartitionName=tw Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF="$state/slurm.conf"

  slurmctld -i -f "$SLURM_CONF" || give_up "slurmctld did not start"
  slurmd -f "$SLURM_CONF" || give_up "slurmd did not start"

  # Bounded wait for the node to register and become idle.
  local s
  for _ in $(seq 1 60); do
    s=$(sinfo -h -N -o '%t' 2>/dev/null | head -n 1)
    case "$s" in idle*) say "up: node $host idle (SLURM_CONF=$SLURM_CONF)"; return 0 ;; esac
    sleep 0.5
  done
  give_up "the node did not become idle within 30 s (state '${s:-none}')"
}

case "$cmd" in
  start) do_start ;;
  stop) do_stop ;;
  *) usage ;;
esac
