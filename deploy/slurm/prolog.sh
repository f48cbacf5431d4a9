#!/bin/sh
# Slurm Prolog (slurm.conf: Prolog=/etc/fleetprof/slurm/prolog.sh, ideally with PrologFlags=Alloc so that it runs
# when the allocation starts): registers the job as slurm:$SLURM_JOB_ID, running, with this node's GPUs of it.
# Never fails: see common.sh.
. "$(dirname "$0")/common.sh"
fleetprof_slurm prolog
exit 0
