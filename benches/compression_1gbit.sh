#!/usr/bin/env bash
# Gradient compression where bandwidth is scarce: two network namespaces ("hosts") joined by
# a veth pair limited to 1 Gbit/s each way with `tc` (tbf), a driver and two executors in the
# first, two executors in the second, and one MNIST job (the 784-1024-1024-10 MLP of
# examples/mnist_wide.toml: 1.9 M parameters, 7.5 MB of gradients a step) run with each
# `cluster.compression`, alternating. Every ring of 4 crosses the link at least twice, so
# each step's all-reduce pays for the link. Prints, per run, the step time (training seconds
# over steps), the all-reduce share of it, samples/s and the test accuracy, then the medians.
#
#   sudo benches/compression_1gbit.sh [REPEATS [EPOCHS [BATCH]]]   # defaults 1 1 64
#
# Needs root, iproute2 (`ip netns`) and tc. RINGFLOW_BIN names the binary (default
# target/release/ringflow: `cargo build --release` first); RATE the link's rate (default
# 1gbit); CODECS the compressions compared (default "none fp16 bf16"). Executors get one
# compute thread each (CORES to change). Every run sets cluster.shared_memory = false, so that
# all compare the same flat TCP ring; SHARED_MEMORY=true compares the hierarchical all-reduce
# instead (the two executors of a namespace sum through shared memory and only their leaders
# cross the link, with compression sending the host sums as 16-bit floats).
set -euo pipefail
cd "$(dirname "$0")/.."

REPEATS="${1:-1}" EPOCHS="${2:-1}" BATCH="${3:-64}"
BIN="${RINGFLOW_BIN:-target/release/ringflow}"
RATE="${RATE:-1gbit}"
CODECS="${CODECS:-none fp16 bf16}"
CORES="${CORES:-1}"
SHARED_MEMORY="${SHARED_MEMORY:-false}"
[ "$(id -u)" = 0 ] || { echo "error: $0 needs root (network namespaces, tc)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "error: $BIN is not an executable (cargo build --release)" >&2; exit 2; }
BIN="$(realpath "$BIN")"
for tool in ip tc python3; do
    command -v "$tool" >/dev/null || { echo "error: $tool is not installed" >&2; exit 2; }
done

ID="rfc$$"
A="$ID-a" B="$ID-b"
IP_A=10.231.0.1 IP_B=10.231.0.2
WORK="$(mktemp -d)"
PIDS=()

cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    for ns in "$A" "$B"; do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

# The two hosts and the limited link between them (tbf on each end's egress).
for ns in "$A" "$B"; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
done
ip link add eth0 netns "$A" type veth peer name eth0 netns "$B"
ip -n "$A" addr add "$IP_A/24" dev eth0
ip -n "$B" addr add "$IP_B/24" dev eth0
for ns in "$A" "$B"; do
    ip -n "$ns" link set eth0 up
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$RATE" burst 256kb latency 50ms
done

SECRET="$WORK/secret"
head -c 24 /dev/urandom | base64 >"$SECRET"
chmod 600 "$SECRET"
URL="http://$IP_A:7077"

ip netns exec "$A" "$BIN" driver --bind "$IP_A:7077" --ui off --secret-file "$SECRET" \
    >"$WORK/driver.log" 2>&1 &
PIDS+=($!)
for ns in "$A" "$A" "$B" "$B"; do
    ip netns exec "$ns" "$BIN" executor --driver "$URL" --cores "$CORES" --quiet \
        --secret-file "$SECRET" >>"$WORK/executors.log" 2>&1 &
    PIDS+=($!)
done

# Waits (up to 60 s) until the driver lists four executors.
for _ in $(seq 120); do
    if ip netns exec "$A" "$BIN" status --driver "$URL" --secret-file "$SECRET" 2>/dev/null |
        grep -q "EXECUTORS (4)"; then
        break
    fi
    sleep 0.5
done
ip netns exec "$A" "$BIN" status --driver "$URL" --secret-file "$SECRET" | grep -q "EXECUTORS (4)" || {
    echo "error: the executors did not register; driver log:" >&2
    cat "$WORK/driver.log" "$WORK/executors.log" >&2
    exit 1
}

# One job with compression $1: "step_ms allreduce_share samples_per_s test_accuracy".
job() {
    local codec="$1" out="$WORK/summary.json"
    ip netns exec "$A" "$BIN" submit examples/mnist_wide.toml --driver "$URL" \
        --secret-file "$SECRET" --set cluster.executors=4 --set "train.epochs=$EPOCHS" \
        --set "train.batch_size=$BATCH" --set "cluster.compression=$codec" \
        --set "cluster.shared_memory=$SHARED_MEMORY" \
        --set "cluster.checkpoint_dir=$WORK/run-$codec" --set data.source=direct \
        --summary-json "$out" >"$WORK/job.log" 2>&1 || {
        echo "error: the job with compression $codec failed:" >&2
        cat "$WORK/job.log" >&2
        exit 1
    }
    python3 - "$out" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
seconds = sum(e["seconds"] for e in s["history"])
allreduce = sum(e["phases"]["allreduce"] for e in s["history"] if "phases" in e)
steps = s["steps"]
print("%.1f %.2f %.0f %.4f" % (1000 * seconds / steps, allreduce / seconds if seconds else 0,
                               s["train_samples_per_s"], s["test_accuracy"]))
EOF
    rm -rf "$WORK/run-$codec" "$out"
}

echo "link $RATE; 4 executors (2 per host, $CORES thread each); mnist_wide, batch $BATCH per executor, $EPOCHS epoch(s)"
printf '%-6s %-3s %9s %14s %10s %9s\n' codec run step_ms allreduce_share samples/s accuracy
for r in $(seq "$REPEATS"); do
    for codec in $CODECS; do
        read -r step share rate acc < <(job "$codec")
        printf '%-6s %-3s %9s %14s %10s %9s\n' "$codec" "$r" "$step" "$share" "$rate" "$acc"
        echo "$codec $step $acc" >>"$WORK/results"
    done
done
echo "medians:"
python3 - "$WORK/results" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
for codec in dict.fromkeys(r[0] for r in rows):
    mine = [r for r in rows if r[0] == codec]
    print("  %-5s step %.1f ms, accuracy %.4f" % (
        codec, statistics.median(float(r[1]) for r in mine),
        statistics.median(float(r[2]) for r in mine)))
EOF
