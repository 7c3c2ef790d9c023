# Sourced by ./lab (which provides say, die, clock, ROOT and the rest of its helpers): ./lab slurm,
# a real one-node Slurm cluster on this machine, to try sbatch, srun, job arrays, time limits and
# MPI launches the way a cluster runs them, without a cluster.

# ---------------------------------------------------------------- a one-node Slurm cluster

# ./lab slurm up|down|status|env: Debian's Slurm 22.05 (slurm-wlm: slurmctld, slurmd, the client
# commands) and MUNGE, with every file of theirs under build/slurm/: slurm.conf, the MUNGE key and
# socket, state, spool, logs, pid files and jobcomp.log. Nothing in /etc is used or changed: the
# daemons and every Slurm command read /etc/slurm/slurm.conf only when SLURM_CONF is unset, so
# `eval "$(./lab slurm env)"` (or slurm_env, inside ./lab) points them at ours, and munged gets our
# key and socket on its command line. Installing the packages is the one step that needs root;
# on a machine with systemd their postinst enables Debian's munge (its own key and socket: no
# clash) and slurmd and slurmctld, which start only once /etc/slurm/slurm.conf exists. A Slurm of
# the machine's own would hold ports 6817 and 6818: stop it first.
#
# The daemons run as the user who runs `up` (SlurmUser and SlurmdUser): here root, as in a
# container, so jobs run as root. Without root, on an instructor's laptop where the packages were
# installed once, `./lab slurm up` as that user works the same (checked with 22.05: sbatch, srun,
# arrays, PMIx MPI, scancel), except that only that user's jobs can run.
slurm_dir="$ROOT/build/slurm"
slurm_conf="$slurm_dir/slurm.conf"
slurm_jobcomp="$slurm_dir/jobcomp.log"
slurm_socket="$slurm_dir/run/munge.socket"

cmd_slurm() {
  case "${1:-}" in
    up) slurm_up ;;
    down) slurm_down ;;
    status) slurm_status ;;
    env) echo "export SLURM_CONF=$slurm_conf" ;;
    *) die "slurm: unknown command '${1:-}' (slurm up, slurm down, slurm status, slurm env)" ;;
  esac
}

# For other ./lab code: the Slurm commands this shell runs from now on use our cluster.
slurm_env() { export SLURM_CONF="$slurm_conf"; }

# 0 when our controller answers.
slurm_running() {
  [ -f "$slurm_conf" ] && command -v scontrol >/dev/null || return 1
  SLURM_CONF="$slurm_conf" timeout 15 scontrol ping 2>/dev/null | grep -q 'is UP'
}

# The pid of one of our daemons (munged, slurmctld, slurmd) when it runs, else nothing and 1. The
# pid file may be stale and its number reused: the process must also have the daemon's name.
slurm_pid() {
  local pid
  pid=$(cat "$slurm_dir/run/$1.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$1" || return 1
  echo "$pid"
}

# The final state of job JOBID (123, or an array task 123_4): COMPLETED, CANCELLED, TIMEOUT,
# FAILED, OUT_OF_MEMORY, NODE_FAIL, ...; nothing while it is pending or running, or when unknown.
# Without slurmdbd sacct knows no job, so the record is jobcomp.log, where slurmctld writes one line
# per finished job (JobId=126 ... JobState=TIMEOUT ...) under the job's own id: an array task's
# is another number, which scontrol maps while it remembers the job (MinJobAge). sacct comes last,
# for a cluster with accounting.
slurm_job_state() {
  local id="${1:?slurm_job_state JOBID}" line state raw
  line=$(SLURM_CONF="${SLURM_CONF:-$slurm_conf}" timeout 15 scontrol -o show job "$id" 2>/dev/null | head -1) || true
  raw=$(sed -n 's/^JobId=\([0-9]*\) .*/\1/p' <<<"$line")
  if [ -z "$raw" ] && [[ "$id" =~ ^[0-9]+$ ]]; then raw=$id; fi
  if [ -n "$raw" ] && [ -f "$slurm_jobcomp" ]; then
    state=$(awk -v id="$raw" '$1 == "JobId=" id { for (i = 2; i <= NF; i++) if ($i ~ /^JobState=/) s = substr($i, 10) }
                              END { print s }' "$slurm_jobcomp")
    [ -n "$state" ] && { echo "$state"; return 0; }
  fi
  state=$(sed -n 's/.* JobState=\([A-Z_]*\).*/\1/p' <<<"$line")
  case "$state" in
    COMPLETED|CANCELLED|TIMEOUT|FAILED|NODE_FAIL|OUT_OF_MEMORY|PREEMPTED|BOOT_FAIL|DEADLINE) echo "$state"; return 0 ;;
  esac
  state=$(SLURM_CONF="${SLURM_CONF:-$slurm_conf}" timeout 15 sacct -n -X -P -j "$id" -o State 2>/dev/null | tail -1) || true
  case "$state" in PENDING|RUNNING|REQUEUED|SUSPENDED|"") ;; *) echo "${state%% *}" ;; esac
}

# Debian's packages, when the commands are missing (any Slurm and MUNGE already on PATH will do).
slurm_install() {
  local c missing=0
  for c in munged slurmctld slurmd sinfo; do
    command -v "$c" >/dev/null || PATH="$PATH:/usr/sbin:/sbin" command -v "$c" >/dev/null || missing=1
  done
  [ $missing = 1 ] || return 0
  command -v apt-get >/dev/null || die "slurm: Slurm and MUNGE are not installed (Debian or Ubuntu: apt-get install slurm-wlm munge)"
  [ "$(id -u)" -eq 0 ] || die "slurm: Slurm and MUNGE are not installed; as root: apt-get install -y --no-install-recommends slurm-wlm munge"
  say "slurm: installing slurm-wlm and munge"
  local apt=(apt-get install -y -q --no-install-recommends slurm-wlm munge) log="$ROOT/build/slurm-apt.log"
  mkdir -p "$ROOT/build"
  # Old package lists may no longer have these versions: update only when the install fails.
  DEBIAN_FRONTEND=noninteractive "${apt[@]}" >"$log" 2>&1 ||
    { DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$log" 2>&1 && DEBIAN_FRONTEND=noninteractive "${apt[@]}" >>"$log" 2>&1; } ||
    die "slurm: apt-get install slurm-wlm munge failed (log: $log)"
}

# slurm.conf for this machine: one node, as slurmd -C measures it (CPUs, sockets, cores, threads,
# RealMemory), one partition. Written by every up that finds the daemons stopped, so a changed
# machine (or hostname) gets a matching node; the state and the MUNGE key stay.
slurm_write_config() {
  local d="$slurm_dir" node name cpus mem user mpi=none
  mkdir -p "$d"/{state,spool,log,run}
  # MUNGE refuses a key directory that others can read, and a socket directory they cannot enter.
  (umask 077; mkdir -p "$d/munge")
  chmod 700 "$d/munge"
  [ -s "$d/munge/munge.key" ] || (umask 077; head -c 1024 /dev/urandom >"$d/munge/munge.key")
  chmod 400 "$d/munge/munge.key"
  node=$(slurmd -C | head -1)
  [[ "$node" == NodeName=* ]] || die "slurm: slurmd -C printed no node line: $node"
  name=$(sed -n 's/^NodeName=\([^ ]*\) .*/\1/p' <<<"$node")
  cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$node")
  mem=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
  user=$(id -un)
  # PMIx when Debian's plugin is there (OpenMPI 4 and 5 are PMIx clients): plain srun then
  # launches MPI programs; --mpi=pmi2 or none still choose per step.
  compgen -G '/usr/lib/*/slurm-wlm/mpi_pmix.so' >/dev/null || compgen -G '/usr/lib*/slurm/mpi_pmix.so' >/dev/null ||
    compgen -G '/usr/local/lib*/slurm/mpi_pmix.so' >/dev/null && mpi=pmix
  cat >"$slurm_conf" <<EOF
# Written by ./lab slurm up (tools/lab/slurm.sh); rewritten by the next up. Use with
#   export SLURM_CONF=$slurm_conf
ClusterName=dtl
# One machine: controller and node talk over the loopback, whatever the network does.
SlurmctldHost=$name(127.0.0.1)
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$slurm_socket
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/run/slurmctld.pid
SlurmdPidFile=$d/run/slurmd.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
# No mail server: --mail-type is accepted and does nothing.
MailProg=/bin/true
# Cores and memory are what jobs ask for (--ntasks, --cpus-per-task, --mem); a job that asks no
# memory gets its CPUs' share, not the whole node.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$((mem / cpus))
# No cgroups (containers rarely delegate them): processes are tracked by their parent ids, and
# neither CPUs nor memory are fenced.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=$mpi
# No slurmdbd: no sacct. slurmctld writes one line per finished job to jobcomp.log instead, with
# its JobState (COMPLETED, CANCELLED, TIMEOUT, FAILED, NODE_FAIL, ...): see slurm_job_state.
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$slurm_jobcomp
# Time limits are checked every 30 s and enforced at once, SIGKILL 5 s after SIGTERM; finished
# jobs stay in scontrol and squeue -t all for an hour.
OverTimeLimit=0
KillWait=5
MinJobAge=3600
# A job asking more than this node has (sbatch -n 64) is refused at once, not left pending.
EnforcePartLimits=ALL
# A node that was down (this machine restarted) comes back when its slurmd registers.
ReturnToService=2
$node State=UNKNOWN NodeAddr=127.0.0.1
PartitionName=debug Nodes=$name Default=YES MaxTime=INFINITE State=UP
EOF
}

slurm_up() {
  slurm_install
  export PATH="$PATH:/usr/sbin:/sbin"
  local d="$slurm_dir" start=$SECONDS
  if slurm_pid munged >/dev/null && slurm_pid slurmctld >/dev/null && slurm_pid slurmd >/dev/null && slurm_running; then
    say "slurm: already up"
    slurm_status
    return 0
  fi
  # Rewrite the config only with both Slurm daemons stopped: a running one keeps the old one.
  if ! slurm_pid slurmctld >/dev/null && ! slurm_pid slurmd >/dev/null; then
    slurm_write_config
  fi
  local log="$d/log"
  if ! slurm_pid munged >/dev/null; then
    rm -f "$slurm_socket" "$slurm_socket.lock"
    munged --socket="$slurm_socket" --key-file="$d/munge/munge.key" --pid-file="$d/run/munged.pid" \
      --log-file="$log/munged.log" --seed-file="$d/munge/munged.seed" ||
      die "slurm: munged did not start (log: $log/munged.log)"
  fi
  # -i: state saved by another Slurm version or config is dropped, not fatal.
  slurm_pid slurmctld >/dev/null || SLURM_CONF="$slurm_conf" slurmctld -i ||
    die "slurm: slurmctld did not start (log: $log/slurmctld.log)"
  slurm_pid slurmd >/dev/null || SLURM_CONF="$slurm_conf" slurmd ||
    die "slurm: slurmd did not start (log: $log/slurmd.log)"
  # Never hang: a node that is not idle within a minute is reported with its reason and logs.
  local node state=""
  node=$(sed -n 's/^NodeName=\([^ ]*\) .*/\1/p' "$slurm_conf")
  while [ $((SECONDS - start)) -lt 60 ]; do
    state=$(SLURM_CONF="$slurm_conf" timeout 10 sinfo -h -n "$node" -o %T 2>/dev/null | head -1) || true
    case "$state" in idle|mixed|allocated|completing) break ;; esac
    if ! slurm_pid slurmctld >/dev/null || ! slurm_pid slurmd >/dev/null; then state="stopped: a daemon exited"; break; fi
    sleep 1
  done
  case "$state" in
    idle|mixed|allocated|completing) ;;
    *) SLURM_CONF="$slurm_conf" timeout 10 sinfo -N -l -R 2>&1 >&2 || true
       tail -n 5 "$log/slurmctld.log" "$log/slurmd.log" >&2 2>/dev/null || true
       die "slurm: node $node is '${state:-not answering}' after $(clock $((SECONDS - start))) (logs: $log; ./lab slurm down stops what started)" ;;
  esac
  say "slurm: up in $(clock $((SECONDS - start))): node $node $state, partition debug; config $slurm_conf"
  cat >&2 <<EOF
  Use it from this shell with
    export SLURM_CONF=$slurm_conf      (or: eval "\$(./lab slurm env)")
  then e.g.  sbatch --wrap 'hostname'   srun -n 2 hostname   squeue   sinfo
  Why a job ended: grep JobId=N $slurm_jobcomp   Stop: ./lab slurm down
EOF
}

# The reverse of up's order (munged, slurmctld, slurmd): the Slurm daemons authenticate every
# message through munged.
slurm_down() {
  local name pid pids=() t=0
  for name in slurmd slurmctld munged; do
    pid=$(slurm_pid "$name") || continue
    kill -TERM "$pid" 2>/dev/null || true
    pids+=("$name:$pid")
  done
  [ ${#pids[@]} -gt 0 ] || { say "slurm: not running"; return 0; }
  # slurmctld saves its state on the way out: give it time, then kill what is left.
  local p left
  while :; do
    left=()
    for p in "${pids[@]}"; do kill -0 "${p#*:}" 2>/dev/null && left+=("$p"); done
    [ ${#left[@]} -eq 0 ] && break
    if [ $t -ge 30 ]; then
      for p in "${left[@]}"; do kill -KILL "${p#*:}" 2>/dev/null || true; done
      say "slurm: killed ${left[*]%%:*} after $t s"
      break
    fi
    sleep 1; t=$((t + 1))
  done
  rm -f "$slurm_dir"/run/*.pid
  say "slurm: stopped ${pids[*]%%:*} (config and state kept in $slurm_dir)"
}

slurm_status() {
  if ! slurm_running; then
    echo "slurm: not running (./lab slurm up starts it)"
    return 1
  fi
  SLURM_CONF="$slurm_conf" sinfo
  SLURM_CONF="$slurm_conf" squeue
}
