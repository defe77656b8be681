#!/usr/bin/env bash
# Elastic training of the digits example on three "nodes" of this host (issue 27's scenario):
#
#   1. an uninterrupted 3-node run gives the reference accuracy;
#   2. three launchers start with `--nnodes 2:3`, one worker each, and train;
#   3. once a few checkpoints exist, one node (its launcher and its worker) is SIGKILLed, as a
#      lost machine would be: the other two re-form a 2-node round and resume from the latest
#      checkpoint at world size 2;
#   4. a fourth launcher starts and the job grows back to three nodes (world size 3), resuming
#      again; the job runs to the end, and the script prints the accuracy of both runs and the
#      rounds from the launchers' summary.
#
# Usage (from the repository root):
#   cargo build --release -p ddp-examples --bin digits
#   bash ddp-examples/scripts/elastic_digits.sh
# With etcd as the rendezvous (no node is a single point of failure; the first node is killed):
#   cargo build --release -p ddp-examples --bin digits --features ddp-core/etcd
#   etcd --data-dir "$(mktemp -d)" --listen-client-urls http://127.0.0.1:2379 \
#       --advertise-client-urls http://127.0.0.1:2379 &
#   BACKEND=etcd ENDPOINT=127.0.0.1:2379 bash ddp-examples/scripts/elastic_digits.sh
#
# Settings (environment): DIGITS (the binary, default target/release/digits), EPOCHS (default
# 150: long enough to kill a node mid-run), BACKEND (c10d or etcd), ENDPOINT (the rendezvous;
# c10d's default is a free local port), LIMIT (seconds before the script gives up, default 900).
set -euo pipefail

DIGITS=${DIGITS:-target/release/digits}
EPOCHS=${EPOCHS:-150}
BACKEND=${BACKEND:-c10d}
LIMIT=${LIMIT:-900}
if [[ ! -x "$DIGITS" ]]; then
    echo "no digits binary at $DIGITS: build it with 'cargo build --release -p ddp-examples --bin digits' (or set DIGITS)" >&2
    exit 2
fi
if [[ -z "${ENDPOINT:-}" ]]; then
    if [[ "$BACKEND" != c10d ]]; then
        echo "BACKEND=$BACKEND needs ENDPOINT (the etcd client address, host:port)" >&2
        exit 2
    fi
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    ENDPOINT=127.0.0.1:$port
fi

work=$(mktemp -d)
DDP_JOB_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export DDP_JOB_TOKEN
# Each node's launcher, as a background job; their pids, by node name.
declare -A pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
started=$(date +%s)
deadline=$((started + LIMIT))

# Waits until the command succeeds, checking every 0.2 s; gives up at the deadline.
wait_for() {
    local what=$1
    shift
    until "$@"; do
        if (($(date +%s) > deadline)); then
            echo "gave up after ${LIMIT}s waiting for $what; logs in $work" >&2
            exit 1
        fi
        sleep 0.2
    done
}

# The global step of the latest complete checkpoint of the elastic run (0 before the first).
latest_step() {
    local latest
    latest=$(cat "$work/elastic/latest" 2>/dev/null || true)
    latest=${latest#step-}
    echo $((10#${latest:-0}))
}

# Whether the elastic run has at least $1 checkpoints.
checkpoints_at_least() {
    (($(find "$work/elastic" -maxdepth 1 -name 'step-*' 2>/dev/null | wc -l) >= $1))
}

# Whether the elastic run's latest checkpoint is past global step $1.
latest_step_above() {
    (($(latest_step) > $1))
}

start_node() {
    local name=$1
    "$DIGITS" --nnodes 2:3 --nproc-per-node 1 --rdzv-backend "$BACKEND" \
        --rdzv-endpoint "$ENDPOINT" --rdzv-id "elastic-digits-$$" --rdzv-last-call 3 \
        --rdzv-heartbeat-timeout 10 --max-restarts 3 --epochs "$EPOCHS" \
        --checkpoint-dir "$work/elastic" >"$work/$name.log" 2>&1 &
    pids[$name]=$!
}

echo "== reference: 3 ranks, uninterrupted ($EPOCHS epochs)"
"$DIGITS" --nproc-per-node 3 --epochs "$EPOCHS" --checkpoint-dir "$work/reference" --fresh \
    >"$work/reference.log" 2>&1
reference=$(grep -o 'test accuracy [0-9.]*%' "$work/reference.log" | tail -n 1)
echo "reference: $reference"

echo "== elastic: nodes a, b, c with --nnodes 2:3, rendezvous $BACKEND at $ENDPOINT"
start_node a
if [[ "$BACKEND" == c10d ]]; then
    # The first launcher to bind the endpoint hosts the store: let it be node a.
    wait_for "node a to host the store" bash -c "exec 3<>/dev/tcp/${ENDPOINT%:*}/${ENDPOINT##*:}" 2>/dev/null
else
    # Node ranks follow the join order: give node a time to join first, so it is node 0 (it
    # also hosts the workers' store of round 0), the hardest node to lose.
    sleep 2
fi
start_node b
start_node c
wait_for "3-node training" grep -q 'round 0 with 3 node(s)' "$work/a.log"
wait_for "three checkpoints" checkpoints_at_least 3
# etcd: the first node (it started the job); c10d: the last (the first hosts the store, the
# job's single point of failure with that backend).
victim=c
[[ "$BACKEND" == etcd ]] && victim=a
step_at_kill=$(latest_step)
echo "killing node $victim (launcher vm:${pids[$victim]} and its worker, SIGKILL) at checkpoint step $step_at_kill"
pkill -KILL -P "${pids[$victim]}" || true
kill -KILL "${pids[$victim]}"
killed_at=$(date +%s.%N)
survivor=a
[[ "$victim" == a ]] && survivor=b
wait_for "the 2-node round" grep -q 'round 1 with 2 node(s)' "$work/$survivor.log"
echo "2-node round formed $(python3 -c "import time; print(f'{time.time() - $killed_at:.1f}')") s after the kill"
wait_for "training at world size 2" latest_step_above "$step_at_kill"
echo "training again at world size 2: checkpoint step $(latest_step)"
start_node d
wait_for "the 3-node round" grep -q 'round 2 with 3 node(s)' "$work/d.log"
echo "grown back to 3 nodes"
for name in "${!pids[@]}"; do
    [[ "$name" == "$victim" ]] && continue
    if ! wait "${pids[$name]}"; then
        echo "node $name failed; its log:" >&2
        cat "$work/$name.log" >&2
        exit 1
    fi
done
trap - EXIT
elastic=$(cat "$work"/{a,b,c,d}.log | grep -o 'test accuracy [0-9.]*%' | tail -n 1)
echo "== rounds (from node $survivor's summary)"
grep -E '^ *(\[.*\] *)?round [0-9]+:|rounds' "$work/$survivor.log" || true
echo "== result"
echo "reference (uninterrupted, 3 ranks): $reference"
echo "elastic (3 -> 2 -> 3 nodes):        $elastic"
echo "logs: $work"
