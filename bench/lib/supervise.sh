# Sourced by bench/run.sh and bench/soak.sh: runs a Python driver that records every process it
# starts (each leading its own process group) in $workdir/pids and stops them itself, and stops
# whatever is left of them when the script exits, also when interrupted.
#
#   supervise NAME KEEP WORKDIR -- COMMAND...
#     NAME     prefix of messages ("bench", "soak")
#     KEEP     1: keep WORKDIR (configs and logs) after a failed run
#     WORKDIR  the driver's working directory; removed at exit unless kept
# Returns (exits with) the driver's exit status.

_sv_name="" _sv_keep=0 _sv_workdir="" _sv_pid=""

# Is pid still the process we started (same start time, field 22 of /proc/pid/stat)?
_sv_ours() {
  [ -r "/proc/$1/stat" ] || return 1
  [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f20)" = "$2" ]
}

_sv_cleanup() {
  local rc=$?
  set +e
  if [ -n "$_sv_pid" ]; then
    kill -TERM "$_sv_pid" 2>/dev/null
    wait "$_sv_pid" 2>/dev/null
  fi
  # The backstop if the driver died before stopping its processes.
  if [ -f "$_sv_workdir/pids" ]; then
    for sig in TERM KILL; do
      left=0
      while read -r pid start; do
        _sv_ours "$pid" "$start" || continue
        left=1
        kill "-$sig" -- "-$pid" 2>/dev/null || kill "-$sig" "$pid" 2>/dev/null || true
      done <"$_sv_workdir/pids"
      if [ "$left" = 0 ]; then break; fi
      if [ "$sig" = TERM ]; then sleep 1; fi   # Weir drains for about a second
    done
  fi
  if [ "$rc" -eq 0 ] || [ "$_sv_keep" != 1 ]; then
    rm -rf "$_sv_workdir"
  else
    echo "$_sv_name: configs and logs kept in $_sv_workdir" >&2
  fi
  exit "$rc"
}

supervise() {
  _sv_name="$1" _sv_keep="$2" _sv_workdir="$3"
  shift 4   # NAME KEEP WORKDIR --
  trap _sv_cleanup EXIT
  trap 'echo "$_sv_name: SIGINT: stopping" >&2; exit 130' INT
  trap 'echo "$_sv_name: SIGTERM: stopping" >&2; exit 143' TERM
  trap 'echo "$_sv_name: SIGHUP: stopping" >&2; exit 129' HUP
  "$@" &
  _sv_pid=$!
  set +e
  wait "$_sv_pid"
  local rc=$?
  set -e
  _sv_pid=""
  exit "$rc"
}
