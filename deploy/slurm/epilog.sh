#!/bin/sh
# Slurm Epilog (slurm.conf: Epilog=/etc/fleetprof/slurm/epilog.sh): marks slurm:$SLURM_JOB_ID finished, failed or
# killed with its exit status and prints a seff-style summary, also appended to the job's output file
# (SLURM_JOB_STDOUT, when it is a regular file of the job's user). Never fails: see common.sh.
. "$(dirname "$0")/common.sh"
if [ -n "${SLURM_JOB_STDOUT:-}" ] && [ "${FLEETPROF_SLURM_SUMMARY_TO_JOB_OUTPUT:-1}" = 1 ]; then
    fleetprof_slurm epilog --job-output "$SLURM_JOB_STDOUT"
else
    fleetprof_slurm epilog
fi
exit 0
