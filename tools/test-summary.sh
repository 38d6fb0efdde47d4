#!/usr/bin/env bash
# test-summary.sh LOG: after a failed `go test`, print what a reader of the
# output's last lines needs to see why: each failed test with its first
# lines, the first data races, and for each package that timed out or
# panicked, the tests it was running and the goroutines stopped in test code
# (where a test waits, or panicked). A CI that keeps only the tail of the
# output then still names the culprit.
set -euo pipefail
log=${1:?usage: test-summary.sh LOG}
echo
echo "=== summary of the failures (the whole output is in $log)"
awk '
	# A failed test and the lines it printed (indented), bounded.
	/^ *--- FAIL/ { fail = 1; n = 0; print; next }
	fail && /^ *(--- |=== |PASS|FAIL|ok )/ { fail = 0 }
	fail && /^ / { if (++n <= 12) print; next }
	fail { fail = 0 }

	# The last line of a failed package.
	/^FAIL\t/ { flush(); print; timeout = 0; running = 0; shown = 0; next }

	# A data race: its report, bounded (two per run).
	/^WARNING: DATA RACE/ { race = (++races <= 2); n = 0; if (race) print; next }
	race && /^==================$/ { race = 0; print ""; next }
	race { if (++n <= 30) print; next }

	# A timed-out or panicking package: what ran, then each goroutine in
	# test code (the panicking one is among them).
	/^panic: / { timeout = 1; print; next }
	timeout && /^\trunning tests:/ { running = 1; print; next }
	running && /^\t\t/ { print; next }
	running { running = 0 }
	timeout && /^goroutine [0-9]+ \[/ { block = $0; keep = 0; next }
	timeout && block != "" && /^$/ { flush(); next }
	timeout && block != "" {
		block = block "\n" $0
		if ($0 ~ /_test\.go:[0-9]+/ && $0 !~ /^created by/) keep = 1
		next
	}
	function flush() {
		if (block != "" && keep && shown < 8) { print block; print ""; shown++ }
		block = ""
	}
' "$log" | head -400
