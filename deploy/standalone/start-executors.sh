#!/usr/bin/env bash
# Starts one ringflow executor on every host of the hosts file, over ssh, and waits until each
# has registered with the driver.
#
# Usage: start-executors.sh [--driver URL] [--hosts FILE]
# The driver's URL: --driver, else RINGFLOW_DRIVER_URL (or RINGFLOW_DRIVER), else the one
# start-driver.sh recorded in the run directory. The secret: RINGFLOW_SECRET_FILE (default: the
# run directory's `secret`, as start-driver.sh made it), else RINGFLOW_SECRET. It travels over
# ssh's stdin into a 0600 file on the host and never appears on a command line. See README.md
# for the other settings.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

url="${RINGFLOW_DRIVER_URL:-${RINGFLOW_DRIVER:-}}"
while [[ $# -gt 0 ]]; do
    case "$1" in
    --driver) [[ $# -ge 2 ]] || die "--driver needs a URL"; url=$2; shift 2 ;;
    --hosts) [[ $# -ge 2 ]] || die "--hosts needs a file"; RINGFLOW_HOSTS=$2; shift 2 ;;
    -h | --help) sed -n '2,10s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (usage: $PROG [--driver URL] [--hosts FILE])" ;;
    esac
done
if [[ -z "$url" ]]; then
    [[ -r "$DRIVER_URL_FILE" ]] ||
        die "no driver URL: pass --driver URL or set RINGFLOW_DRIVER_URL (or start the driver here with start-driver.sh)"
    url=$(<"$DRIVER_URL_FILE")
fi
[[ "$url" =~ ^https?://[^[:space:]]+$ ]] || die "the driver URL '$url' is not http://HOST:PORT or https://HOST:PORT"

secure=1
secret_input=()
if [[ "$RINGFLOW_INSECURE_NO_SECRET" == 1 ]]; then
    secure=0
    say "warning: RINGFLOW_INSECURE_NO_SECRET=1: executors start without a secret"
elif [[ -e "$RINGFLOW_SECRET_FILE" ]]; then
    check_secret_file "$RINGFLOW_SECRET_FILE"
    secret_input=(file "$RINGFLOW_SECRET_FILE")
elif [[ -n "${RINGFLOW_SECRET:-}" ]]; then
    [[ ${#RINGFLOW_SECRET} -ge 16 ]] || die "RINGFLOW_SECRET is ${#RINGFLOW_SECRET} characters long; it needs at least 16"
    secret_input=(env)
else
    die "no secret: $RINGFLOW_SECRET_FILE does not exist and RINGFLOW_SECRET is not set (start-driver.sh creates the file)"
fi

read_hosts "$RINGFLOW_HOSTS"
ssh_words
read -r -a executor_opts <<<"${RINGFLOW_EXECUTOR_OPTS:-}"
register_wait=$((RINGFLOW_HOST_TIMEOUT - 15))
((register_wait >= 5)) || register_wait=5

# Runs on each host (POSIX sh): $1 run dir ("" = ~/.ringflow/run), $2 the executor's name there,
# $3 the ringflow binary, $4 seconds to wait for registration, $5 1 = a secret comes on stdin,
# then the executor's arguments. Prints one line; exits 0 when the executor runs.
# shellcheck disable=SC2016 # expanded by the remote shell
REMOTE_START='
dir=$1 key=$2 bin=$3 wait_s=$4 secure=$5
shift 5
[ -n "$dir" ] || dir="$HOME/.ringflow/run"
alive() {
    kill -0 "$1" 2>/dev/null || return 1
    [ -r "/proc/$1/stat" ] || return 0
    [ "$(sed "s/.*) //" "/proc/$1/stat" | cut -c 1)" != Z ]
}
# The last error line of log $1, else its last line.
last() {
    grep "error" "$1" 2>/dev/null | tail -n 1 | grep . ||
        grep -v "^[[:space:]]*$" "$1" 2>/dev/null | tail -n 1
}
umask 077
mkdir -p "$dir" || { echo "cannot create the run directory $dir"; exit 1; }
pid_file="$dir/executor-$key.pid"
log="$dir/executor-$key.log"
secret="$dir/executor-$key.secret"
if [ -f "$pid_file" ]; then
    pid=$(cat "$pid_file")
    if alive "$pid" && { [ ! -r "/proc/$pid/cmdline" ] || tr "\000" " " <"/proc/$pid/cmdline" | grep -q " executor "; }; then
        cat >/dev/null
        echo "already running: pid $pid ($pid_file)"
        exit 0
    fi
fi
command -v "$bin" >/dev/null 2>&1 || { echo "cannot find the ringflow binary $bin (set RINGFLOW_BIN)"; exit 1; }
if [ "$secure" = 1 ]; then
    rm -f "$secret"
    cat >"$secret" || { echo "cannot write the secret file $secret"; exit 1; }
    [ -s "$secret" ] || { echo "no secret arrived on stdin"; exit 1; }
    set -- "$@" --secret-file "$secret"
else
    cat >/dev/null
fi
[ ! -f "$log" ] || mv -f "$log" "$log.1"
nohup "$bin" executor "$@" </dev/null >"$log" 2>&1 &
pid=$!
echo "$pid" >"$pid_file"
n=0
while :; do
    line=$(grep -m 1 "registered with" "$log" 2>/dev/null)
    if [ -n "$line" ]; then
        echo "started: pid $pid, log $log: $line"
        exit 0
    fi
    if ! alive "$pid"; then
        rm -f "$pid_file"
        line=$(last "$log")
        echo "the executor exited: ${line:-it logged nothing} (log: $log)"
        exit 1
    fi
    if [ "$n" -ge $((wait_s * 5)) ]; then
        line=$(last "$log")
        kill "$pid" 2>/dev/null
        sleep 2
        kill -9 "$pid" 2>/dev/null
        rm -f "$pid_file"
        echo "the executor did not register within $wait_s s (stopped it); it logged: ${line:-nothing} (log: $log)"
        exit 1
    fi
    sleep 0.2
    n=$((n + 1))
done
'

# Starts the executor of host $1 (an index into HOST_*); prints one line, exits non-zero on
# failure. stdout of ssh is the remote script's line; stderr, ssh's own complaints.
start_one() {
    local i=$1
    local -a host_args run
    read -r -a host_args <<<"${HOST_ARGS[$i]}"
    run=(remote_run "$i" "$RINGFLOW_HOST_TIMEOUT" "the executor start (RINGFLOW_HOST_TIMEOUT)"
        "$REMOTE_START" ringflow-start "$RINGFLOW_REMOTE_RUN_DIR" "${HOST_KEY[$i]}" "$RINGFLOW_BIN"
        "$register_wait" "$secure" --driver "$url" "${executor_opts[@]}" "${host_args[@]}")
    case "${secret_input[0]:-none}" in
    file) "${run[@]}" <"${secret_input[1]}" ;;
    env) printf '%s' "$RINGFLOW_SECRET" | "${run[@]}" ;;
    *) "${run[@]}" </dev/null ;;
    esac
}

say "starting ${#HOST_DEST[@]} executor(s) for $url"
on_each_host start_one
failed=$HOST_FAILED
ids=()
for i in "${!HOST_DEST[@]}"; do
    if ((HOST_OK[i])) && [[ "${HOST_LINE[$i]}" =~ executor\ ([^[:space:]]+)\ registered ]]; then
        ids+=("$i:${BASH_REMATCH[1]}")
    fi
done

# Cross-check with the driver: every executor started now is listed by `ringflow status` (when
# the ringflow binary is at hand here too; RINGFLOW_CHECK_STATUS=0 skips this).
if [[ ${#ids[@]} -gt 0 && "${RINGFLOW_CHECK_STATUS:-1}" != 0 ]] && command -v "$RINGFLOW_BIN" >/dev/null 2>&1; then
    status_env=()
    [[ "${secret_input[0]:-}" != file ]] || status_env=(RINGFLOW_SECRET_FILE="${secret_input[1]}")
    deadline=$((SECONDS + 15))
    while :; do
        missing=()
        if listing=$(env "${status_env[@]}" timeout 10 "$RINGFLOW_BIN" status --driver "$url" 2>&1); then
            for entry in "${ids[@]}"; do
                grep -q -- "^${entry#*:} " <<<"$listing" || missing+=("$entry")
            done
        else
            say "warning: cannot check the executors with 'ringflow status': $(tail -n 1 <<<"$listing")"
            break
        fi
        [[ ${#missing[@]} -gt 0 ]] || break
        if ((SECONDS >= deadline)); then
            for entry in "${missing[@]}"; do
                printf '%s: error: %s: executor %s is not listed by ringflow status --driver %s\n' \
                    "$PROG" "${HOST_DEST[${entry%%:*}]}" "${entry#*:}" "$url" >&2
                failed=$((failed + 1))
            done
            break
        fi
        sleep 1
    done
fi

if ((failed > 0)); then
    die "$failed of ${#HOST_DEST[@]} executor(s) did not start (see the lines above)"
fi
say "${#HOST_DEST[@]} executor(s) running for $url"
