# Shared by prolog.sh and epilog.sh (sourced, not run). slurmd runs them as root with no PATH and a bare
# environment: the settings come from FLEETPROF_SLURM_ENV (default /etc/fleetprof/slurm.env, KEY=VALUE lines,
# root-owned, mode 0600: it holds a token). Nothing here may fail the job: a prolog or epilog that exits non-zero
# drains the node, so every outcome ends in `exit 0`, and `timeout` bounds the whole call.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
FLEETPROF_SLURM_ENV="${FLEETPROF_SLURM_ENV:-/etc/fleetprof/slurm.env}"
if [ -r "$FLEETPROF_SLURM_ENV" ]; then
    set -a
    # shellcheck disable=SC1090
    . "$FLEETPROF_SLURM_ENV"
    set +a
fi
# A command, split into words on purpose: e.g. "/opt/fleetprof/venv/bin/python -m fleetprof.cli".
FLEETPROF_BIN="${FLEETPROF_BIN:-/opt/fleetprof/venv/bin/fleetprof}"
FLEETPROF_SLURM_TIMEOUT_S="${FLEETPROF_SLURM_TIMEOUT_S:-30}"
# Where the command's messages and the summary go; empty: this script's own stdout and stderr (which slurmd
# discards unless its debug level keeps them).
FLEETPROF_SLURM_LOG="${FLEETPROF_SLURM_LOG-/var/log/fleetprof-slurm.log}"

fleetprof_slurm() {
    if command -v timeout >/dev/null 2>&1; then
        set -- timeout -k 5 "$FLEETPROF_SLURM_TIMEOUT_S" $FLEETPROF_BIN slurm "$@"
    else
        set -- $FLEETPROF_BIN slurm "$@"
    fi
    if [ -n "$FLEETPROF_SLURM_LOG" ] && { [ -w "$FLEETPROF_SLURM_LOG" ] || [ -w "$(dirname "$FLEETPROF_SLURM_LOG")" ]; }; then
        "$@" >>"$FLEETPROF_SLURM_LOG" 2>&1 </dev/null
    else
        "$@" </dev/null
    fi
    rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "fleetprof slurm: '$FLEETPROF_BIN slurm' exited $rc (124: over ${FLEETPROF_SLURM_TIMEOUT_S} s); the job is not affected" >&2
    fi
    return 0
}
