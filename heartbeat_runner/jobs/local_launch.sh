# Heartbeat's local job launcher: sh local_launch.sh RUN_DIR -- COMMAND...
#
# Started detached by the local jobs backend (jobs/local.py), one per run. A POSIX shell starts in about a
# millisecond where a Python interpreter takes tens: a busy tick launching hundreds of jobs is not held up.
# The contract (the retired Python launcher, local_launcher.py, kept it too: runs it started read the same):
#   1. claim the run: ``launched`` appears whole (written aside, then hard-linked: ``ln`` fails when it
#      exists), holding this shell's pid; a second launcher of the same run exits 0 without running anything;
#   2. run the command; its exit code is the launcher's;
#   3. write ``result.json`` whole (aside, then renamed) with the exit code and when the command itself
#      started and ended, so a later tick tells success from failure even if the runner is gone.
# A command killed by signal N reports 128+N, as a shell does.
run_dir=$1
if [ "$#" -lt 3 ] || [ "$2" != "--" ]; then
    echo "usage: sh local_launch.sh RUN_DIR -- COMMAND..." >&2
    exit 2
fi
shift 2

now() {  # ISO 8601, UTC; microseconds where date(1) knows %N (GNU), whole seconds elsewhere
    stamp=$(date -u +%Y-%m-%dT%H:%M:%S.%6N)
    case $stamp in *N*) stamp=$(date -u +%Y-%m-%dT%H:%M:%S) ;; esac
    printf '%s+00:00' "$stamp"
}

aside="$run_dir/.launched.$$.aside"
echo "$$" > "$aside" || exit 1
if ! ln "$aside" "$run_dir/launched" 2>/dev/null; then
    rm -f "$aside"
    exit 0  # another launcher of this run started it: the command runs at most once
fi
rm -f "$aside"
echo "$$" > "$run_dir/pid"  # what older versions of the backend read

started=$(now)
"$@"
code=$?
ended=$(now)
printf '{"exit_code": %d, "started_at": "%s", "ended_at": "%s"}' "$code" "$started" "$ended" \
    > "$run_dir/.result.json.$$.aside"
mv -f "$run_dir/.result.json.$$.aside" "$run_dir/result.json"
exit "$code"
