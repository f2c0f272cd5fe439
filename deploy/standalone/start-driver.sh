#!/usr/bin/env bash
# Starts a ringflow driver in the background on this machine, waits until it is ready, and prints
# its URL (the one executors use) on stdout.
#
# Usage: start-driver.sh [extra `ringflow driver` arguments...]
# Configuration: environment variables or ringflow-env.sh (see README.md): RINGFLOW_BIN,
# RINGFLOW_DRIVER_BIND, RINGFLOW_UI, RINGFLOW_DRIVER_HOST, RINGFLOW_DRIVER_OPTS,
# RINGFLOW_SECRET_FILE (or RINGFLOW_SECRET), RINGFLOW_RUN_DIR, RINGFLOW_START_TIMEOUT.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
    sed -n '2,8s/^# \{0,1\}//p' "$0"
    exit 0
fi

umask 077
mkdir -p "$RINGFLOW_RUN_DIR" || die "cannot create the run directory $RINGFLOW_RUN_DIR"

pid=$(live_pid "$DRIVER_PID_FILE" driver)
[[ -z "$pid" ]] || die "a driver is already running (pid $pid in $DRIVER_PID_FILE); stop it first (stop-all.sh)"
command -v "$RINGFLOW_BIN" >/dev/null 2>&1 ||
    die "cannot find the ringflow binary '$RINGFLOW_BIN' (set RINGFLOW_BIN)"

args=(driver --bind "$RINGFLOW_DRIVER_BIND" --ui "$RINGFLOW_UI")
if [[ "$RINGFLOW_INSECURE_NO_SECRET" == 1 ]]; then
    say "warning: RINGFLOW_INSECURE_NO_SECRET=1: anyone who reaches $RINGFLOW_DRIVER_BIND can register executors and submit jobs"
    unset RINGFLOW_SECRET RINGFLOW_SECRET_FILE
else
    if [[ ! -e "$RINGFLOW_SECRET_FILE" ]]; then
        mkdir -p "$(dirname "$RINGFLOW_SECRET_FILE")" ||
            die "cannot create the directory of the secret file $RINGFLOW_SECRET_FILE"
        tmp="$RINGFLOW_SECRET_FILE.tmp.$$"
        if [[ -n "${RINGFLOW_SECRET:-}" ]]; then
            printf '%s' "$RINGFLOW_SECRET" >"$tmp"
            say "wrote RINGFLOW_SECRET to $RINGFLOW_SECRET_FILE"
        else
            head -c 32 /dev/urandom | od -A n -v -t x1 | tr -d ' \n' >"$tmp"
            say "generated a secret in $RINGFLOW_SECRET_FILE"
        fi
        mv -f "$tmp" "$RINGFLOW_SECRET_FILE"
    fi
    check_secret_file "$RINGFLOW_SECRET_FILE"
    # The driver reads the file; the secret itself stays out of its environment.
    unset RINGFLOW_SECRET
    args+=(--secret-file "$RINGFLOW_SECRET_FILE")
fi
read -r -a extra <<<"${RINGFLOW_DRIVER_OPTS:-}"
args+=("${extra[@]}" "$@")

[[ ! -f "$DRIVER_LOG" ]] || mv -f "$DRIVER_LOG" "$DRIVER_LOG.1"
rm -f "$DRIVER_URL_FILE"
nohup "$RINGFLOW_BIN" "${args[@]}" </dev/null >"$DRIVER_LOG" 2>&1 &
pid=$!
printf '%s\n' "$pid" >"$DRIVER_PID_FILE"

# Ready: it printed its addresses and its web UI answers /readyz with 200 (503 while it gets
# ready); with `--ui off`, printing the control-plane address is all there is to wait for.
deadline=$((SECONDS + RINGFLOW_START_TIMEOUT))
listen="" ui=""
while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
        rm -f "$DRIVER_PID_FILE"
        status=0
        wait "$pid" || status=$?
        die "the driver exited (status $status) during startup: $(last_line "$DRIVER_LOG") (log: $DRIVER_LOG)"
    fi
    [[ -n "$listen" ]] || listen=$(sed -n 's/.*driver listening on \([a-z]*:\/\/[^ ]*\).*/\1/p' "$DRIVER_LOG" | head -n 1)
    [[ -n "$ui" ]] || ui=$(sed -n 's/.*web UI at \([a-z]*:\/\/[^/ ]*\).*/\1/p' "$DRIVER_LOG" | head -n 1)
    if [[ -n "$listen" && "$RINGFLOW_UI" == off ]]; then
        break
    fi
    if [[ -n "$listen" && -n "$ui" ]]; then
        ui_scheme=${ui%%://*}
        ui_host=${ui#*://}
        ui_host=${ui_host%:*}
        ui_host=${ui_host#[}
        ui_host=${ui_host%]}
        case "$ui_host" in
        0.0.0.0) ui_host=127.0.0.1 ;;
        ::) ui_host=::1 ;;
        esac
        # 404: a ringflow without health probes, serving all the same. Over HTTPS without curl,
        # or with mutual TLS (the probe has no client certificate), there is no answer to
        # wait for: the driver prints its addresses once it serves.
        code=$(http_status "$ui_host" "${ui##*:}" /readyz "$ui_scheme")
        [[ "$code" != 200 && "$code" != 404 && ("$ui_scheme" != https || -n "$code") ]] || break
    fi
    if ((SECONDS >= deadline)); then
        how=$(stop_pid "$pid" 5)
        rm -f "$DRIVER_PID_FILE"
        die "the driver was not ready within $RINGFLOW_START_TIMEOUT s (${how} it); last log line: $(last_line "$DRIVER_LOG") (log: $DRIVER_LOG)"
    fi
    sleep 0.2
done

# The URL executors dial: RINGFLOW_DRIVER_HOST, else the bound address, else (bound to all
# interfaces) this machine's first address.
scheme=${listen%%://*}
port=${listen##*:}
host=${RINGFLOW_DRIVER_HOST:-}
if [[ -z "$host" ]]; then
    host=${RINGFLOW_DRIVER_BIND%:*}
    host=${host#[}
    host=${host%]}
    if [[ -z "$host" || "$host" == 0.0.0.0 || "$host" == :: ]]; then
        host=$(hostname -I 2>/dev/null | awk '{print $1}' || true)
        [[ -n "$host" ]] || host=$(hostname -f 2>/dev/null || hostname)
    fi
fi
[[ "$host" != *:* || "$host" == \[* ]] || host="[$host]"
url="$scheme://$host:$port"
printf '%s\n' "$url" >"$DRIVER_URL_FILE"
case "$ui" in
*://0.0.0.0:* | *://\[::\]:*) ui="${ui%%://*}://$host:${ui##*:}" ;;
esac
say "driver running (pid $pid) at $url; web UI ${ui:-off}${ui:+/}; log $DRIVER_LOG"
printf '%s\n' "$url"
