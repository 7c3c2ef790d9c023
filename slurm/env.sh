# shellcheck shell=bash
# Sourced by every batch script here (gpu-1node, gpu-2nodes, grade-class): the environment a
# dtl job needs on a cluster node, set the same way for each, so what ./lab grade-class --slurm
# runs is what the GPU scripts run.
#   - the job starts in the checkout it was submitted from (a filesystem the nodes share);
#   - the site's modules first (a module's OpenMPI knows the cluster's network and Slurm), then
#     the kit's environment when the checkout has one (./lab sources it too);
#   - builds use the cores Slurm gave the job, not the node's;
#   - a job given GPUs runs on CUDA (DTL_DEVICE=cuda) unless told otherwise.
cd "${SLURM_SUBMIT_DIR:-.}" || { echo "slurm/env.sh: cannot enter ${SLURM_SUBMIT_DIR:-.}" >&2; exit 1; }
if command -v module >/dev/null 2>&1; then
  module load cuda 2>/dev/null || true
  module load openmpi 2>/dev/null || true
fi
# shellcheck disable=SC1091
[ -f build/kit/env.sh ] && . build/kit/env.sh
export DTL_JOBS="${DTL_JOBS:-${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-$(nproc)}}}"
if [ -z "${DTL_DEVICE:-}" ] && [ -n "${SLURM_GPUS_ON_NODE:-}${SLURM_JOB_GPUS:-}" ]; then
  export DTL_DEVICE=cuda
fi
# dtl_launch PROGRAM [ARGS...]: one rank per task of the allocation, the way every script here
# starts ranks: `srun --mpi=pmix` where Slurm has the PMIx plugin (OpenMPI's ranks then take their
# rank and size from Slurm; SLURM_LOCALID picks the GPU), else mpirun inside the allocation (it
# asks Slurm for the nodes and slots). DTL_LAUNCH=mpirun|srun chooses; slurm/ranks-check.sbatch
# tries both.
dtl_has_pmix() { srun --mpi=list 2>&1 | grep -qw pmix; }
dtl_launch() {
  local how="${DTL_LAUNCH:-}"
  if [ -z "$how" ]; then
    how=mpirun
    dtl_has_pmix && how=srun
  fi
  case "$how" in
    srun) srun --mpi=pmix --kill-on-bad-exit=1 "$@" ;;
    mpirun)
      # Slurm's slots are the tasks; with --ntasks-per-node the same count on every node.
      local map=()
      [ -n "${SLURM_NTASKS_PER_NODE:-}" ] && map=(--map-by "ppr:${SLURM_NTASKS_PER_NODE%%(*}:node")
      mpirun -n "$SLURM_NTASKS" "${map[@]}" --bind-to none -x DTL_NCCL_TIMEOUT -x NCCL_DEBUG \
        -x DTL_DEVICE "$@" ;;
    *) echo "dtl_launch: DTL_LAUNCH is '$how' (mpirun or srun)" >&2; return 2 ;;
  esac
}
