#!/usr/bin/env bash
# Stops the executors on every host of the hosts file (over ssh, through the pid files that
# start-executors.sh left there), then the driver on this machine. Each gets SIGTERM, and
# SIGKILL when it still runs RINGFLOW_STOP_TIMEOUT seconds later.
#
# Usage: stop-all.sh [--hosts FILE]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

while [[ $# -gt 0 ]]; do
    case "$1" in
    --hosts) [[ $# -ge 2 ]] || die "--hosts needs a file"; RINGFLOW_HOSTS=$2; shift 2 ;;
    -h | --help) sed -n '2,6s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (usage: $PROG [--hosts FILE])" ;;
    esac
done

# Runs on each host (POSIX sh): $1 run dir ("" = ~/.ringflow/run), $2 the executor's name there,
# $3 seconds between SIGTERM and SIGKILL. Prints one line.
# shellcheck disable=SC2016 # expanded by the remote shell
REMOTE_STOP='
dir=$1 key=$2 grace=$3
[ -n "$dir" ] || dir="$HOME/.ringflow/run"
alive() {
    kill -0 "$1" 2>/dev/null || return 1
    [ -r "/proc/$1/stat" ] || return 0
    [ "$(sed "s/.*) //" "/proc/$1/stat" | cut -c 1)" != Z ]
}
pid_file="$dir/executor-$key.pid"
secret="$dir/executor-$key.secret"
if [ ! -f "$pid_file" ]; then
    rm -f "$secret"
    echo "no executor to stop (no $pid_file)"
    exit 0
fi
pid=$(cat "$pid_file")
if ! alive "$pid" || { [ -r "/proc/$pid/cmdline" ] && ! tr "\000" " " <"/proc/$pid/cmdline" | grep -q " executor "; }; then
    rm -f "$pid_file" "$secret"
    echo "no executor to stop (pid $pid had exited)"
    exit 0
fi
kill -TERM "$pid" 2>/dev/null
n=0
while alive "$pid"; do
    if [ "$n" -ge $((grace * 5)) ]; then
        kill -KILL "$pid" 2>/dev/null
        sleep 0.5
        if alive "$pid"; then
            echo "executor pid $pid survived SIGKILL"
            exit 1
        fi
        rm -f "$pid_file" "$secret"
        echo "killed executor pid $pid (still running $grace s after SIGTERM)"
        exit 0
    fi
    sleep 0.2
    n=$((n + 1))
done
rm -f "$pid_file" "$secret"
echo "stopped executor pid $pid"
'

stop_one() {
    remote_run "$1" $((RINGFLOW_STOP_TIMEOUT + 30)) "the executor stop" "$REMOTE_STOP" ringflow-stop \
        "$RINGFLOW_REMOTE_RUN_DIR" "${HOST_KEY[$1]}" "$RINGFLOW_STOP_TIMEOUT" </dev/null
}

failed=0
if [[ -f "$RINGFLOW_HOSTS" ]]; then
    read_hosts "$RINGFLOW_HOSTS"
    ssh_words
    on_each_host stop_one
    failed=$((failed + HOST_FAILED))
else
    say "warning: no hosts file at $RINGFLOW_HOSTS: no executors stopped (set RINGFLOW_HOSTS)"
fi

pid=$(live_pid "$DRIVER_PID_FILE" driver)
if [[ -n "$pid" ]]; then
    how=$(stop_pid "$pid" "$RINGFLOW_STOP_TIMEOUT")
    if alive "$pid"; then
        printf '%s: error: the driver (pid %s) survived SIGKILL\n' "$PROG" "$pid" >&2
        failed=$((failed + 1))
    else
        say "driver pid $pid: $how"
        rm -f "$DRIVER_PID_FILE" "$DRIVER_URL_FILE"
    fi
else
    say "no driver to stop (no live pid in $DRIVER_PID_FILE)"
    rm -f "$DRIVER_PID_FILE" "$DRIVER_URL_FILE"
fi

((failed == 0)) || die "$failed process(es) or host(s) could not be stopped (see the lines above)"
