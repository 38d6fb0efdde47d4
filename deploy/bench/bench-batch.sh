#!/usr/bin/env bash
# Batch benchmark: N jobs, each in a process of its own (containers are reused
# within the namespace, swept between jobs; REUSE=none gives each job a fresh
# container), through the fleet (broker, worker with 4 slots and the Podman
# runtime, front-end: three separate processes from bin/), against 4 parallel
# lanes of `podman run --rm` on the same machine in the same run, RUNS times. Prints both rates, their ratio, and the peak resident
# memory (VmHWM) of each process.
#
#   make build && deploy/bench/bench-batch.sh
#   N=80 POOL=6 deploy/bench/bench-batch.sh
#
# Environment: N (jobs, default 200), REUSE (namespace), LANES (baseline lanes, 4), SLOTS (worker
# slots, 4), POOL (warm sandboxes, 4), IMAGE, BIN (bin), NATS_PORT, HTTP_PORT,
# OCI_RUNTIME (runc), RUNS (3: how many times to run both sides, alternating;
# more prints medians), PROFILE=1 (needs perf: CPU per job by command name in
# each phase), KEEP=1 keeps the temp dir with logs and results.
set -euo pipefail

N=${N:-200}
REUSE=${REUSE:-namespace}
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
	[[ -n ${prof_pid:-} ]] && kill -INT "$prof_pid" 2>/dev/null
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
"$BIN/worker" --nats "$nats" --id bench --slots "$SLOTS" --pool "$POOL" --reuse "$REUSE" --image "$IMAGE" --oci-runtime "$OCI_RUNTIME" --log-level warn 2>"$dir/worker.log" &
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

# CPU accounting. busy: the whole machine's busy CPU time (user, nice, system,
# irq, softirq, steal of /proc/stat) in seconds; pcpu PID: utime+stime of one
# process in seconds. A phase is measured from its start until the machine is
# quiet again (containers still being removed, the warm pool refilling), so its
# CPU-s per job covers each job's whole container life on either path.
hz=$(getconf CLK_TCK)
busy() { awk -v hz="$hz" '/^cpu / { printf "%.2f", ($2 + $3 + $4 + $7 + $8 + $9) / hz; exit }' /proc/stat; }
pcpu() { awk -v hz="$hz" '{ sub(/^.*\) /, ""); printf "%.2f", ($12 + $13) / hz }' "/proc/$1/stat" 2>/dev/null || echo 0; }
# settle waits until a 0.5 s window is less than 15% busy (at most 15 s).
settle() {
	local a b
	for _ in $(seq 1 30); do
		a=$(busy); sleep 0.5; b=$(busy)
		awk -v a="$a" -v b="$b" -v n="$(nproc)" 'BEGIN { exit !((b - a) / 0.5 / n < 0.15) }' && return 0
	done
	return 0
}
# PROFILE=1: sample every CPU (perf, cpu-clock at PERF_HZ) during each phase
# and print CPU-s per job by command name, kernel threads included.
PERF_HZ=${PERF_HZ:-499}
prof_pid=""
prof_start() {
	[[ -n ${PROFILE:-} ]] || return 0
	perf record -q -e cpu-clock -F "$PERF_HZ" -a -o "$1" 2>/dev/null &
	prof_pid=$!
	sleep 0.3
}
prof_stop() {
	[[ -n $prof_pid ]] || return 0
	kill -INT "$prof_pid" 2>/dev/null || true
	wait "$prof_pid" 2>/dev/null || true
	prof_pid=""
}
# prof_report FILE: the commands above 0.5 ms/job, idle (swapper) left out
prof_report() {
	perf report -i "$1" --sort comm -n --stdio 2>/dev/null |
		awk -v hz="$PERF_HZ" -v n="$N" '/^#/ || NF < 3 { next }
			{ c = $3; for (i = 4; i <= NF; i++) c = c " " $i; if (c == "swapper") next
			  ms = $2 / hz / n * 1000; tot += ms; if (ms >= 0.5) printf "  %-18s %6.1f ms/job\n", c, ms }
			END { printf "  %-18s %6.1f ms/job\n", "(all but idle)", tot }'
}
svc_pid=$(pgrep -P "$worker_pid" -f 'podman.*system service' | head -1 || true)
settle

RUNS=${RUNS:-3}
run=$(date +%s)
for r in $(seq 1 "$RUNS"); do
	# Baseline: LANES parallel lanes of podman run --rm.
	prof_start "$dir/base-$r.perf"
	c0=$(busy)
	start=$(now)
	# Explicit rlimits: podman's defaults exceed the hard limits of some hosts
	# (DESIGN §8: "setrlimit … not permitted"); the worker's sandboxes set them too.
	seq "$N" | xargs -P "$LANES" -I{} podman run --rm --runtime "$OCI_RUNTIME" --network none \
		--ulimit nofile=1024:1024 --ulimit nproc=1024:1024 "$IMAGE" python3 -c 'print(1)' >"$dir/baseline.out"
	end=$(now)
	settle
	c1=$(busy)
	prof_stop
	base_ok=$(grep -c '^1$' "$dir/baseline.out" || true)
	base_rate=$(rate "$N" "$start" "$end")
	base_cpu=$(awk -v a="$c0" -v b="$c1" -v n="$N" 'BEGIN { printf "%.3f", (b - a) / n }')

	# Fleet: the same work as N jobs through the HTTP jobs API.
	for i in $(seq 1 "$N"); do printf '{"id":"bench-%s-%d-%d","code":"print(1)"}\n' "$run" "$r" "$i"; done >"$dir/jobs.jsonl"
	prof_start "$dir/fleet-$r.perf"
	c0=$(busy); s0=$(pcpu "${svc_pid:-0}"); w0=$(pcpu "$worker_pid")
	start=$(now)
	"$BIN/frontend" submit --url "http://127.0.0.1:$HTTP_PORT" --progress 0 --out "$dir/results.jsonl" "$dir/jobs.jsonl" 2>"$dir/submit.log"
	end=$(now)
	settle
	c1=$(busy); s1=$(pcpu "${svc_pid:-0}"); w1=$(pcpu "$worker_pid")
	prof_stop
	fleet_ok=$(grep -c '"status":"success"' "$dir/results.jsonl" || true)
	fleet_rate=$(rate "$N" "$start" "$end")
	fleet_cpu=$(awk -v a="$c0" -v b="$c1" -v n="$N" 'BEGIN { printf "%.3f", (b - a) / n }')
	svc_cpu=$(awk -v a="$s0" -v b="$s1" -v n="$N" 'BEGIN { printf "%.3f", (b - a) / n }')
	wrk_cpu=$(awk -v a="$w0" -v b="$w1" -v n="$N" 'BEGIN { printf "%.3f", (b - a) / n }')

	echo "run $r/$RUNS: jobs: $N; baseline lanes: $LANES; worker slots: $SLOTS, warm pool: $POOL, reuse: $REUSE; image: $IMAGE"
	echo "baseline podman run --rm x$LANES: $base_rate jobs/s ($base_ok/$N ok), $base_cpu CPU-s/job (machine)"
	echo "fleet (broker+worker+frontend):  $fleet_rate jobs/s ($fleet_ok/$N ok), $fleet_cpu CPU-s/job (machine; podman service $svc_cpu, worker $wrk_cpu)"
	awk -v f="$fleet_rate" -v b="$base_rate" 'BEGIN { printf "speed-up: %.2fx (goal 5x)\n", f / b }'
	if [[ -n ${PROFILE:-} ]]; then
		echo "CPU by command (perf samples), baseline:"; prof_report "$dir/base-$r.perf"
		echo "CPU by command (perf samples), fleet:"; prof_report "$dir/fleet-$r.perf"
	fi
	echo "$base_rate $fleet_rate $base_cpu $fleet_cpu" >>"$dir/runs"
	[[ $fleet_ok == "$N" ]] || { echo "bench-batch: $((N - fleet_ok)) fleet jobs did not succeed; see $dir" >&2; KEEP=1; exit 1; }
done
if ((RUNS > 1)); then
	# medians of the runs
	med() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
	mb=$(awk '{ print $1 }' "$dir/runs" | med); mf=$(awk '{ print $2 }' "$dir/runs" | med)
	echo "median of $RUNS runs: baseline $mb jobs/s ($(awk '{ print $3 }' "$dir/runs" | med) CPU-s/job), fleet $mf jobs/s ($(awk '{ print $4 }' "$dir/runs" | med) CPU-s/job); speed-ups: $(awk '{ printf "%.2fx ", $2 / $1 }' "$dir/runs")"
	awk '{ print $2 / $1 }' "$dir/runs" | med | awk '{ printf "median speed-up: %.2fx (goal 5x)\n", $1 }'
fi
echo "peak RSS (VmHWM): broker $(hwm $broker_pid) MiB, worker $(hwm $worker_pid) MiB, frontend $(hwm $frontend_pid) MiB${svc_pid:+, podman service (started by the worker) $(hwm "$svc_pid") MiB}"
