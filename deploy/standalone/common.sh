# Shared by the standalone scripts (sourced, not run): configuration, messages, the hosts file,
# pid files and probes.
# shellcheck shell=bash
# shellcheck disable=SC2034 # the variables set here are read by the scripts that source this

RINGFLOW_SBIN="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROG="$(basename "$0")"

die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 1
}

say() {
    printf '%s: %s\n' "$PROG" "$*" >&2
}

# Configuration: ringflow-env.sh (like Spark's spark-env.sh) in RINGFLOW_CONF_DIR, then defaults.
RINGFLOW_CONF_DIR="${RINGFLOW_CONF_DIR:-$RINGFLOW_SBIN}"
if [[ -f "$RINGFLOW_CONF_DIR/ringflow-env.sh" ]]; then
    # shellcheck source=/dev/null
    . "$RINGFLOW_CONF_DIR/ringflow-env.sh" ||
        die "$RINGFLOW_CONF_DIR/ringflow-env.sh failed (exit status $?)"
fi

if [[ -z "${RINGFLOW_RUN_DIR:-}" ]]; then
    [[ -n "${HOME:-}" ]] || die "neither RINGFLOW_RUN_DIR nor HOME is set"
    RINGFLOW_RUN_DIR="$HOME/.ringflow/run"
fi
RINGFLOW_BIN="${RINGFLOW_BIN:-ringflow}"
RINGFLOW_DRIVER_BIND="${RINGFLOW_DRIVER_BIND:-0.0.0.0:7077}"
RINGFLOW_UI="${RINGFLOW_UI:-0.0.0.0:4040}"
RINGFLOW_SECRET_FILE="${RINGFLOW_SECRET_FILE:-$RINGFLOW_RUN_DIR/secret}"
RINGFLOW_HOSTS="${RINGFLOW_HOSTS:-$RINGFLOW_CONF_DIR/hosts}"
RINGFLOW_SSH="${RINGFLOW_SSH:-ssh}"
RINGFLOW_SSH_OPTS="${RINGFLOW_SSH_OPTS:-}"
RINGFLOW_REMOTE_RUN_DIR="${RINGFLOW_REMOTE_RUN_DIR:-}"
RINGFLOW_START_TIMEOUT="${RINGFLOW_START_TIMEOUT:-60}"
RINGFLOW_HOST_TIMEOUT="${RINGFLOW_HOST_TIMEOUT:-90}"
RINGFLOW_STOP_TIMEOUT="${RINGFLOW_STOP_TIMEOUT:-20}"
RINGFLOW_INSECURE_NO_SECRET="${RINGFLOW_INSECURE_NO_SECRET:-0}"

for _var in RINGFLOW_START_TIMEOUT RINGFLOW_HOST_TIMEOUT RINGFLOW_STOP_TIMEOUT; do
    [[ "${!_var}" =~ ^[0-9]+$ && "${!_var}" -gt 0 ]] ||
        die "$_var must be a whole number of seconds, not '${!_var}'"
done
unset _var

DRIVER_PID_FILE="$RINGFLOW_RUN_DIR/driver.pid"
DRIVER_LOG="$RINGFLOW_RUN_DIR/driver.log"
DRIVER_URL_FILE="$RINGFLOW_RUN_DIR/driver.url"

# The ssh options as words (RINGFLOW_SSH_OPTS is split on white space, like Spark's
# SPARK_SSH_OPTS), followed by defaults that the user's options override (ssh keeps the first
# value it reads for an option).
ssh_words() {
    local -a opts=()
    read -r -a opts <<<"$RINGFLOW_SSH_OPTS"
    SSH_WORDS=("${opts[@]}" -o ConnectTimeout=10 -o ServerAliveInterval=5 -o ServerAliveCountMax=3
        -o LogLevel=ERROR)
}

# Single-quotes $1 for a POSIX shell (the remote login shell parses what ssh sends).
shell_quote() {
    local s=${1//\'/\'\\\'\'}
    printf "'%s'" "$s"
}

# Reads the hosts file into the arrays HOST_DEST (what ssh dials), HOST_KEY (the name of the
# executor's files on that host: the host name, made unique) and HOST_ARGS (its extra executor
# arguments, one string of words). A line is `[user@]host [cores] [executor args...]`, or
# `ssh://[user@]host[:port] ...`; `#` starts a comment.
read_hosts() {
    local file=$1 line n=0 dest rest host key
    local -a words
    local -A seen=()
    [[ -f "$file" ]] || die "no hosts file at $file (copy $RINGFLOW_SBIN/hosts.example, or set RINGFLOW_HOSTS)"
    [[ -r "$file" ]] || die "cannot read the hosts file $file"
    HOST_DEST=()
    HOST_KEY=()
    HOST_ARGS=()
    while IFS= read -r line || [[ -n "$line" ]]; do
        n=$((n + 1))
        line=${line%%#*}
        read -r -a words <<<"$line"
        [[ ${#words[@]} -gt 0 ]] || continue
        dest=${words[0]}
        [[ "$dest" != -* ]] || die "$file line $n: '$dest' is not a host name"
        if [[ ${#words[@]} -gt 1 && "${words[1]}" =~ ^[0-9]+$ ]]; then
            rest="--cores ${words[1]} ${words[*]:2}"
        else
            rest="${words[*]:1}"
        fi
        host=${dest#ssh://}
        host=${host#*@}
        if [[ "$host" == \[* ]]; then
            host=${host#[}
            host=${host%%]*}
        elif [[ "$dest" == ssh://* ]]; then
            host=${host%:*}
        fi
        [[ -n "$host" ]] || die "$file line $n: '$dest' names no host"
        key=${host//[^A-Za-z0-9._-]/_}
        seen[$key]=$((${seen[$key]:-0} + 1))
        if [[ ${seen[$key]} -gt 1 ]]; then
            key="$key-${seen[$key]}"
        fi
        HOST_DEST+=("$dest")
        HOST_KEY+=("$key")
        HOST_ARGS+=("$rest")
    done <"$file"
    [[ ${#HOST_DEST[@]} -gt 0 ]] || die "the hosts file $file lists no host"
}

# The pid in pid file $1 when that process is alive (and, where /proc tells, is a ringflow
# process whose command line contains $2); nothing otherwise.
live_pid() {
    local file=$1 want=$2 pid
    [[ -f "$file" ]] || return 0
    pid=$(<"$file")
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    alive "$pid" || return 0
    if [[ -r "/proc/$pid/cmdline" ]]; then
        tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$want" || return 0
    fi
    printf '%s' "$pid"
}

# Prints the HTTP status code of GET $4://$1:$2$3 ($4: http, the default, or https, whose
# certificate is not checked), or nothing when there is no answer; with curl when there is one,
# else (http only) with bash's /dev/tcp; either way within a few seconds.
http_status() {
    local host=$1 port=$2 path=$3 scheme=${4:-http} url_host=$1
    [[ "$host" != *:* ]] || url_host="[$host]"
    if command -v curl >/dev/null 2>&1; then
        curl -s -k -o /dev/null -m 3 -w '%{http_code}' "$scheme://$url_host:$port$path" 2>/dev/null |
            grep -E '^[1-5][0-9][0-9]$' || true
    elif [[ "$scheme" == https ]]; then
        return 0
    else
        # shellcheck disable=SC2016 # expanded by the inner bash
        timeout 4 bash -c 'exec 3<>"/dev/tcp/$0/$1" || exit 1
            printf "GET %s HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n\r\n" "$2" "$0" >&3
            IFS=" " read -r -t 3 _ code _ <&3 && printf "%s" "$code"' \
            "$host" "$port" "$path" 2>/dev/null || true
    fi
}

# Checks that secret file $1 is readable by its owner only and holds at least 16 characters.
check_secret_file() {
    local file=$1 mode len
    [[ -r "$file" ]] || die "cannot read the secret file $file"
    mode=$(stat -c %a "$file" 2>/dev/null || stat -f %Lp "$file")
    [[ "$mode" =~ ^[0-7]*[0-7]00$ ]] ||
        die "the secret file $file can be read by others (mode $mode): chmod 600 $file"
    len=$(tr -d '\r\n' <"$file" | wc -c)
    [[ "$len" -ge 16 ]] || die "the secret in $file is $len characters long; it needs at least 16"
}

# Whether process $1 exists and is not a zombie (a process that has exited but that its parent
# has not reaped yet still answers `kill -0`).
alive() {
    local stat
    kill -0 "$1" 2>/dev/null || return 1
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    stat=${stat##*) }
    [[ "${stat:0:1}" != Z ]]
}

# The last non-empty line of file $1, or a note that it has none.
last_line() {
    local line
    line=$(grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -n 1 || true)
    printf '%s' "${line:-(nothing logged)}"
}

# Sends SIGTERM to pid $1, and SIGKILL when it still runs $2 seconds later. Prints how it ended.
stop_pid() {
    local pid=$1 grace=$2 deadline
    kill -TERM "$pid" 2>/dev/null || {
        printf 'had already exited'
        return 0
    }
    deadline=$((SECONDS + grace))
    while alive "$pid"; do
        if ((SECONDS >= deadline)); then
            kill -KILL "$pid" 2>/dev/null || true
            deadline=$((SECONDS + 5))
            while alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
            printf 'killed (still running %s s after SIGTERM)' "$grace"
            return 0
        fi
        sleep 0.2
    done
    printf 'stopped'
}

# Runs the sh script $4 (named $5 in ps) with arguments ${@:6} on host $1 (an index into HOST_*)
# over ssh, with this function's stdin as its stdin, giving up after $2 s; $3 says what runs
# there, for the timeout message. Prints one line (the script's last, or what went wrong) and
# returns non-zero on failure.
remote_run() {
    local i=$1 limit=$2 what=$3 script=$4 name=$5 cmd a rc=0 out err
    shift 5
    cmd="sh -c $(shell_quote "$script") $name"
    for a in "$@"; do
        cmd+=" $(shell_quote "$a")"
    done
    err=$(mktemp)
    out=$(timeout -k 5 "$limit" "$RINGFLOW_SSH" "${SSH_WORDS[@]}" -- "${HOST_DEST[$i]}" "$cmd" \
        2>"$err") || rc=$?
    out=$(printf '%s\n' "$out" | grep -v '^[[:space:]]*$' | tail -n 1 || true)
    case "$rc" in
    0) printf '%s\n' "$out" ;;
    124 | 137) printf 'no answer within %s s from ssh or %s\n' "$limit" "$what" ;;
    255) printf 'ssh failed: %s\n' "$(last_line "$err")" ;;
    *) printf '%s\n' "${out:-exit status $rc: $(last_line "$err")}" ;;
    esac
    rm -f "$err"
    return "$rc"
}

# Runs `$1 INDEX` for every host of the hosts file at once, each with its output captured, then
# reports each host's line: `HOST: LINE`, or an error line naming the host when it failed.
# Sets HOST_LINE[i] and HOST_OK[i] (1 or 0) per host and HOST_FAILED to the number of failures.
on_each_host() {
    local fn=$1 dir i ok
    local -a pids=()
    dir=$(mktemp -d)
    for i in "${!HOST_DEST[@]}"; do
        "$fn" "$i" >"$dir/$i" 2>&1 &
        pids+=($!)
    done
    HOST_LINE=()
    HOST_OK=()
    HOST_FAILED=0
    for i in "${!HOST_DEST[@]}"; do
        ok=1
        wait "${pids[$i]}" || ok=0
        HOST_LINE[i]=$(<"$dir/$i") || true
        HOST_OK[i]=$ok
        if ((ok)); then
            say "${HOST_DEST[$i]}: ${HOST_LINE[$i]}"
        else
            printf '%s: error: %s: %s\n' "$PROG" "${HOST_DEST[$i]}" "${HOST_LINE[$i]}" >&2
            HOST_FAILED=$((HOST_FAILED + 1))
        fi
    done
    rm -rf "$dir"
}
