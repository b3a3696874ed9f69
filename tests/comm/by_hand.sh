#!/usr/bin/env bash
# Two processes of PROGRAM started by hand with one launcher's variables, as a job script would
# start them: exits non-zero when either fails (or both ran and printed nothing to check).
#   by_hand.sh torchrun|file|srun -- PROGRAM ARGS...
#     torchrun  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (a free port)
#     file      RANK and WORLD_SIZE, meeting in a fresh folder (STEPBENCH_RENDEZVOUS=file:DIR)
#     srun      SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_NODEID,
#               SLURM_STEP_TASKS_PER_NODE, SLURM_STEP_NODELIST=localhost, SLURM_JOB_ID, SLURM_STEP_ID
#               (the port from the job and step ids, as stepbench derives it)
set -uo pipefail
kind=$1
[[ ${2:-} == -- ]] || { echo "by_hand.sh: usage: by_hand.sh torchrun|file|srun -- PROGRAM ARGS..." >&2; exit 2; }
shift 2
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port_free() { python3 -c "import socket,sys; s=socket.socket(); s.bind(('', $1))" 2>/dev/null; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
job=0
if [[ $kind == srun ]]; then  # a job id whose port (15000 + job * 16 % 20000) is free here
  for _ in $(seq 50); do
    job=$((RANDOM * 7 + 1))
    port_free $((15000 + job * 16 % 20000)) && break
  done
fi
port=$(free_port)
pids=()
for r in 0 1; do
  case $kind in
    torchrun) env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
                "$@" > "$dir/out$r" 2>&1 & ;;
    file) env RANK=$r WORLD_SIZE=2 STEPBENCH_RENDEZVOUS=file:"$dir/rendezvous" "$@" > "$dir/out$r" 2>&1 & ;;
    srun) env SLURM_PROCID=$r SLURM_STEP_NUM_TASKS=2 SLURM_LOCALID=$r SLURM_NODEID=0 SLURM_STEP_TASKS_PER_NODE=2 \
            SLURM_STEP_NODELIST=localhost SLURM_JOB_ID=$job SLURM_STEP_ID=0 "$@" > "$dir/out$r" 2>&1 & ;;
    *) echo "by_hand.sh: unknown launcher $kind" >&2; exit 2 ;;
  esac
  pids+=($!)
done
rc=0
for r in 0 1; do
  wait "${pids[$r]}" || rc=1
done
for r in 0 1; do
  echo "---- rank $r"
  cat "$dir/out$r"
done
exit $rc
