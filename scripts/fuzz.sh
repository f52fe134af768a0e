#!/usr/bin/env bash
# Runs every cargo-fuzz target for SECONDS each (default 600), from the seed corpora in
# fuzz/corpus/<target>. Prints executions and crashes per target; exits non-zero on a crash.
# Stable toolchain: no sanitizer (-s none); the code under test has no unsafe.
#   scripts/fuzz.sh          # 10 minutes per target
#   scripts/fuzz.sh 20       # the brief CI run
#   FUZZ_TARGETS=observed scripts/fuzz.sh 60
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:-600}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --version 0.13.2
cargo fuzz build -O -s none
status=0
for t in ${FUZZ_TARGETS:-node_yaml allow_list observed desired}; do
  work="corpus-run/$t"
  mkdir -p "$work" artifacts/$t
  log="corpus-run/$t.log"
  if cargo fuzz run -O -s none "$t" "$work" "corpus/$t" -- -max_total_time="$secs" -rss_limit_mb=2048 >"$log" 2>&1; then
    result=ok
  else
    result=CRASH
    status=1
  fi
  execs=$(grep -o 'Done [0-9]* runs' "$log" | grep -o '[0-9]*' || echo "?")
  echo "fuzz $t: ${secs}s, executions ${execs}, result ${result}"
  [ "$result" = ok ] || tail -n 30 "$log"
done
exit $status
