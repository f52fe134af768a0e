#!/usr/bin/env bash
# Runs every cargo-fuzz target for SECONDS each (default 600), from the seed corpora in
# fuzz/corpus/<target>. Prints executions and crashes per target; exits non-zero on a crash.
# Stable toolchain: no sanitizer (-s none); the code under test has no unsafe.
#   scripts/fuzz.sh          # 10 minutes per target
#   scripts/fuzz.sh 20       # the brief CI run
#   scripts/fuzz.sh build    # only installs cargo-fuzz and builds the targets (CI does this
#                            # early, in the background, and runs them later)
#   FUZZ_TARGETS=observed scripts/fuzz.sh 60
#   FUZZ_JOBS=2 scripts/fuzz.sh 30   # two targets at a time (one core each), each still SECONDS
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:-600}"
jobs="${FUZZ_JOBS:-1}"
command -v cargo-fuzz >/dev/null || cargo install -q cargo-fuzz --locked --version 0.13.2
cargo fuzz build -O -s none
[ "$secs" != build ] || exit 0

# One target: its log in corpus-run/<target>.log; exit status non-zero on a crash.
fuzz_one() {
  local t=$1
  mkdir -p "corpus-run/$t" "artifacts/$t"
  cargo fuzz run -O -s none "$t" "corpus-run/$t" "corpus/$t" -- -max_total_time="$secs" -rss_limit_mb=2048 \
    >"corpus-run/$t.log" 2>&1
}
status=0
# The result line of a target that has ended (and the tail of its log on a crash).
report() {
  local t=$1 rc=$2 result=ok execs
  if [ "$rc" -ne 0 ]; then result=CRASH; status=1; fi
  execs=$(grep -o 'Done [0-9]* runs' "corpus-run/$t.log" | grep -o '[0-9]*' || echo "?")
  echo "fuzz $t: ${secs}s, executions ${execs}, result ${result}"
  [ "$result" = ok ] || tail -n 30 "corpus-run/$t.log"
}
pids=()
names=()
# Waits for the oldest running target and reports it.
reap() {
  local rc=0
  wait "${pids[0]}" || rc=$?
  report "${names[0]}" "$rc"
  pids=("${pids[@]:1}")
  names=("${names[@]:1}")
}
for t in ${FUZZ_TARGETS:-node_yaml allow_list observed desired}; do
  [ "${#pids[@]}" -lt "$jobs" ] || reap
  fuzz_one "$t" &
  pids+=("$!")
  names+=("$t")
done
while [ "${#pids[@]}" -gt 0 ]; do reap; done
exit $status
