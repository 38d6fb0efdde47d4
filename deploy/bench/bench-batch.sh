#!/usr/bin/env bash
# Batch benchmark (issue 6): N jobs, each in a fresh container, through the fleet
# (broker, worker with 4 slots and the Podman runtime, front-end: three separate
# processes from bin/), against 4 parallel lanes of `podman run --rm` on the same
# machine in the same run. Prints both rates, their ratio, and the peak resident
# memory (VmHWM) of each process.
#
#   make build && deploy/bench/bench-batch.sh
#   N=80 POOL=6 deploy/bench/bench-batch.sh
#
# Environment: N (jobs, default 40), LANES (baseline lanes, 4), SLOTS (worker
# slots, 4), POOL (warm sandboxes, 4), IMAGE, BIN (bin), NATS_PORT, HTTP_PORT,
# OCI_RUNTIME (runc), KEEP=1 keeps the temp dir with logs and results.
set -euo pipefail

N=${N:-40}
LANES=${LANES:-4}
SLOTS=${SLOTS:-4}
POOL=${POOL:-4}
IMAGE=${IMAGE:-localhost/mcpexec-sandbox:latest}
BIN=${BIN:-bin}
NATS_PORT=${NATS_PORT:-14222}
HTTP_PORT=${HTTP_PORT:-18080}
OCI_RUNTIME=${OCI_RUNTIME:-runc}

for b in broker worker frontend; do
	[[ -x $BIN/$b ]] || { echo "bench-batch: $BIN/$b is missing: run make build first" >&2; exit 2; }
done
command -v podman >/dev/null || { echo "bench-batch: podman is not installed: run make deps" >&2; exit 2; }
podman image exists "$IMAGE" || { echo "bench-batch: image $IMAGE is missing: run make image" >&2; exit 2; }

dir=$(mktemp -d /tmp/mcpexec-bench.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	if [[ ${KEEP:-0} == 1 ]]; then echo "logs and results kept in $dir"; else rm -rf "$dir"; fi
}
trap cleanup EXIT

now() { date +%s.%N; }
rate() { awk -v n="$1" -v s="$2" -v e="$3" 'BEGIN { printf "%.2f", n / (e - s) }'; }
# peak resident set size of a process and its descendants, in MiB
hwm() { awk '/VmHWM/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status" 2>/dev/null || echo "?"; }

# Peak memory: VmHWM is the kernel's high-water mark of each process, read at
# the end; a podman service the worker started is reported separately.
nats="nats://127.0.0.1:$NATS_PORT"
"$BIN/broker" --data "$dir/broker" --listen "127.0.0.1:$NATS_PORT" --log-level warn 2>"$dir/broker.log" &
pids+=($!); broker_pid=$!
for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$NATS_PORT") 2>/dev/null && break; sleep 0.1; done
"$BIN/worker" --nats "$nats" --id bench --slots "$SLOTS" --pool "$POOL" --image "$IMAGE" --oci-runtime "$OCI_RUNTIME" --log-level warn 2>"$dir/worker.log" &
pids+=($!); worker_pid=$!
"$BIN/frontend" --nats "$nats" --http "127.0.0.1:$HTTP_PORT" --log-level warn 2>"$dir/frontend.log" &
pids+=($!); frontend_pid=$!

# /healthz is 200 once the front-end is connected and a worker answers.
for _ in $(seq 1 300); do
	curl -fsS "http://127.0.0.1:$HTTP_PORT/healthz" >/dev/null 2>&1 && break
	sleep 0.2
done
curl -fsS "http://127.0.0.1:$HTTP_PORT/healthz" >/dev/null || { echo "bench-batch: the fleet did not become healthy; see $dir/*.log" >&2; KEEP=1; exit 1; }
# Let the warm pool fill (a deployed worker is long-running; its start-up is not
# part of the throughput).
sleep 5

# Baseline: LANES parallel lanes of podman run --rm.
start=$(now)
# Explicit rlimits: podman's defaults exceed the hard limits of some hosts
# (DESIGN §8: "setrlimit … not permitted"); the worker's sandboxes set them too.
seq "$N" | xargs -P "$LANES" -I{} podman run --rm --runtime "$OCI_RUNTIME" --network none \
	--ulimit nofile=1024:1024 --ulimit nproc=1024:1024 "$IMAGE" python3 -c 'print(1)' >"$dir/baseline.out"
end=$(now)
base_ok=$(grep -c '^1$' "$dir/baseline.out" || true)
base_rate=$(rate "$N" "$start" "$end")

# Fleet: the same work as N jobs through the HTTP jobs API.
run=$(date +%s)
for i in $(seq 1 "$N"); do printf '{"id":"bench-%s-%d","code":"print(1)"}\n' "$run" "$i"; done >"$dir/jobs.jsonl"
start=$(now)
"$BIN/frontend" submit --url "http://127.0.0.1:$HTTP_PORT" --progress 0 --out "$dir/results.jsonl" "$dir/jobs.jsonl" 2>"$dir/submit.log"
end=$(now)
fleet_ok=$(grep -c '"status":"success"' "$dir/results.jsonl" || true)
fleet_rate=$(rate "$N" "$start" "$end")

svc_pid=$(pgrep -P "$worker_pid" -f 'podman.*system service' | head -1 || true)
echo "jobs: $N; baseline lanes: $LANES; worker slots: $SLOTS, warm pool: $POOL; image: $IMAGE"
echo "baseline podman run --rm x$LANES: $base_rate jobs/s ($base_ok/$N ok)"
echo "fleet (broker+worker+frontend):  $fleet_rate jobs/s ($fleet_ok/$N ok)"
awk -v f="$fleet_rate" -v b="$base_rate" 'BEGIN { printf "speed-up: %.2fx (goal 1.5x)\n", f / b }'
echo "peak RSS (VmHWM): broker $(hwm $broker_pid) MiB, worker $(hwm $worker_pid) MiB, frontend $(hwm $frontend_pid) MiB${svc_pid:+, podman service (started by the worker) $(hwm "$svc_pid") MiB}"
[[ $fleet_ok == "$N" ]] || { echo "bench-batch: $((N - fleet_ok)) fleet jobs did not succeed; see $dir" >&2; KEEP=1; exit 1; }
