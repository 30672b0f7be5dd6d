#!/usr/bin/env bash
# local_cluster.sh - a real one-node SLURM cluster on this machine, for CI and for trying the
# sbatch files. Debian 12 packages (munge, slurmctld, slurmd, slurm-client: Slurm 22.05), run as
# root, no systemd, no cgroups, no slurmdbd.
#
#   slurm/local_cluster.sh install   apt-get install the packages if any is missing
#   slurm/local_cluster.sh start     write the config, start munged, slurmctld, slurmd; wait idle
#   slurm/local_cluster.sh stop      stop the daemons this script started (recorded PIDs only)
#   slurm/local_cluster.sh status    daemons, sinfo, squeue
#   slurm/local_cluster.sh up        install + start
#
# Knobs (environment):
#   LOCAL_CLUSTER_DIR   state, logs, PIDs, job-completion log  (default /tmp/sedd_slurm)
#   SLURM_CONF          config path, also read by the clients  (default /etc/slurm/slurm.conf)
#   LOCAL_CLUSTER_GPUS  N > 0 declares a placeholder GRES gpu:N backed by /dev/null links, so that
#                       production scripts with '#SBATCH --gres=gpu:1' are scheduled unmodified.
#                       There is no GPU behind it: jobs see CUDA_VISIBLE_DEVICES but torch finds
#                       no CUDA device and runs on the CPU. (default 1)
#   LOCAL_CLUSTER_WAIT  seconds to wait for the controller / the node   (default 120)
#
# Pitfall: any SLURM client command run before slurm.conf exists hangs for about a minute.
set -euo pipefail

DIR=${LOCAL_CLUSTER_DIR:-/tmp/sedd_slurm}
export SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
GPUS=${LOCAL_CLUSTER_GPUS:-1}
WAIT=${LOCAL_CLUSTER_WAIT:-120}
NODE=$(hostname -s)

say() { printf '[local_cluster %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
fail() { say "error: $*"; exit 1; }
running() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

install_packages() {
  local missing=0 cmd
  for cmd in munged slurmctld slurmd sbatch; do command -v "$cmd" >/dev/null || missing=1; done
  if [[ $missing == 0 ]]; then
    say "packages present: $(dpkg-query -W -f='${Package}=${Version} ' munge slurmctld slurmd)"
    return
  fi
  [[ $(id -u) == 0 ]] || fail "installing slurm needs root (apt-get)"
  say "installing munge slurmctld slurmd slurm-client (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Without an init system the postinst scripts print "policy-rc.d denied": harmless.
  apt-get install -y -qq --no-install-recommends munge slurmctld slurmd slurm-client >/dev/null
}

write_config() {
  local conf_dir mem topo gres_types="" node_gres=""
  conf_dir=$(dirname "$SLURM_CONF")
  mkdir -p "$conf_dir" "$DIR"/{state,spool,log,run,dev}
  # RealMemory may not exceed what slurmd detects, or the node is drained as "invalid".
  mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -1)
  topo=$(slurmd -C | head -1 | grep -o 'CPUs=[0-9]* Boards=.* ThreadsPerCore=[0-9]*')
  if ((GPUS > 0)); then
    # Slurm drops GRES without a File= and refuses regular files: link to a character device.
    local i
    for ((i = 0; i < GPUS; i++)); do ln -sfn /dev/null "$DIR/dev/placeholder_gpu$i"; done
    gres_types="GresTypes=gpu"
    node_gres="Gres=gpu:$GPUS"
    printf '%s\n' "# placeholder GPUs for scheduling tests only: no GPU behind them" \
      "AutoDetect=off" \
      "NodeName=$NODE Name=gpu File=$DIR/dev/placeholder_gpu[0-$((GPUS - 1))]" \
      >"$conf_dir/gres.conf"
  else
    rm -f "$conf_dir/gres.conf"
  fi
  cat >"$SLURM_CONF" <<EOF
# written by slurm/local_cluster.sh: one node, no cgroups, no accounting database
ClusterName=sedd-local
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# sacct needs slurmdbd; final job states go to a flat file instead
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=5
MinJobAge=600
MaxArraySize=1001
$gres_types
NodeName=$NODE NodeAddr=127.0.0.1 $topo RealMemory=$mem $node_gres State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
  # slurmd reads cgroup.conf if it exists; keep it inert (no cgroup plugins are configured).
  printf '%s\n' "ConstrainCores=no" "ConstrainRAMSpace=no" "ConstrainDevices=no" \
    >"$conf_dir/cgroup.conf"
  say "wrote $SLURM_CONF ($NODE: $topo, ${mem} MB, placeholder gpus: $GPUS)"
}

start_munge() {
  if running "$DIR/run/munged.pid"; then say "munged already running"; return; fi
  [[ -s /etc/munge/munge.key ]] || head -c 1024 /dev/urandom >/etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /etc/munge/munge.key /run/munge /var/log/munge /var/lib/munge
  chmod 400 /etc/munge/munge.key
  rm -f /run/munge/munged.pid
  # munged daemonises itself; run it as the munge user, as Debian's unit file does.
  runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
  local _
  for _ in $(seq 50); do [[ -s /run/munge/munged.pid ]] && break; sleep 0.1; done
  cp /run/munge/munged.pid "$DIR/run/munged.pid"
  munge -n | unmunge >/dev/null || fail "munge credential round trip failed"
}

start_daemon() {  # start_daemon NAME ARGS...: foreground daemon, detached, PID recorded
  local name=$1
  shift
  if running "$DIR/run/$name.bgpid"; then say "$name already running"; return; fi
  setsid nohup "$name" "$@" >"$DIR/log/$name.stdout" 2>&1 </dev/null &
  echo $! >"$DIR/run/$name.bgpid"
}

start() {
  local t0=$SECONDS _ state=""
  write_config
  start_munge
  start_daemon slurmctld -D -c -f "$SLURM_CONF"  # -c: cold start, forget old jobs
  for _ in $(seq "$WAIT"); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 1; done
  scontrol ping | grep -q UP || { tail -n 30 "$DIR/log/slurmctld.log" >&2; fail "no slurmctld"; }
  start_daemon slurmd -D -f "$SLURM_CONF" -N "$NODE"
  for _ in $(seq "$WAIT"); do
    state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null | head -1)
    [[ $state == idle || $state == mixed || $state == allocated ]] && break
    sleep 1
  done
  if [[ $state != idle && $state != mixed && $state != allocated ]]; then
    scontrol show node "$NODE" >&2 || true
    tail -n 30 "$DIR/log/slurmd.log" >&2 || true
    fail "node $NODE is '$state', not idle"
  fi
  say "cluster up in $((SECONDS - t0)) s: $(sinfo -h -o '%P %a %D %T %N %G')"
}

stop_one() {  # stop_one NAME PIDFILE: TERM, then KILL after 15 s
  local pid
  [[ -s $2 ]] || return 0
  pid=$(cat "$2")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    local _
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" || true; fi
    say "stopped $1 (pid $pid)"
  fi
  rm -f "$2"
}

stop() {
  stop_one slurmd "$DIR/run/slurmd.bgpid"
  stop_one slurmctld "$DIR/run/slurmctld.bgpid"
  stop_one munged "$DIR/run/munged.pid"
}

status() {
  local f
  for f in munged.pid slurmctld.bgpid slurmd.bgpid; do
    if running "$DIR/run/$f"; then echo "${f%%.*}: pid $(cat "$DIR/run/$f")"; else
      echo "${f%%.*}: not running"; fi
  done
  if [[ -f $SLURM_CONF ]]; then sinfo || true; squeue || true; fi
}

case ${1:-} in
  install) install_packages ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  up) install_packages; start ;;
  *) echo "usage: $0 {install|start|stop|status|up}" >&2; exit 2 ;;
esac
