#!/usr/bin/env bash
# The gate steps of examples/ci/github-workflow.yml and examples/ci/gitlab-ci.yml, as one script both run, so
# what CI does can be run (and is tested: tests/ci/test_ci_steps.py) on any machine:
#
#   MANIFEST=examples/quickstart/manifest.yaml bash examples/ci/run-steps.sh key     # the baseline cache key
#   MANIFEST=examples/quickstart/manifest.yaml bash examples/ci/run-steps.sh check   # gate check; exit as it does
#
# MANIFEST   the manifest under review (required)
# BASE_REV   the revision its baseline is read from (default origin/main; fetched beforehand)
# GATE_OUT   where the reports go (default gate-out): report.json, gates.xml, summary.md, exit-code
# SERVEGATE_CACHE      the baseline cache folder (default .servegate-cache)
# SERVEGATE_CACHE_KEY  the key `key` printed, when the caller has it (saves computing it twice)
#
# `check` writes the key into the cache folder (KEY) and empties the folder's entries when the key it finds
# there is another: a CI cache restored under a broader key (GitLab's per-branch cache) then never grows with
# entries of old baselines. Every entry is also checked against its own key when it is read.
# Exit status of `check`: 0 no gate failed, 1 a gate failed (block the merge), 2 a usage error or an
# unreachable engine. With $GITHUB_STEP_SUMMARY set, the summary is appended to the job's summary page.
set -uo pipefail

: "${MANIFEST:?set MANIFEST to the manifest under review}"
BASE_REV=${BASE_REV:-origin/main}
GATE_OUT=${GATE_OUT:-gate-out}
cache=${SERVEGATE_CACHE:-.servegate-cache}

cache_key() {
    gate cache-key --baseline "git:$BASE_REV" --candidate "$MANIFEST"
}

case "${1:-}" in
key)
    cache_key
    ;;
check)
    key=${SERVEGATE_CACHE_KEY:-$(cache_key)} || exit 2
    if [ -f "$cache/KEY" ] && [ "$(cat "$cache/KEY")" != "$key" ]; then
        echo "baseline cache $cache was kept for another baseline: emptied"
        rm -rf "$cache/outputs"
    fi
    mkdir -p "$cache" "$GATE_OUT"
    printf '%s\n' "$key" > "$cache/KEY"
    gate check --baseline "git:$BASE_REV" --candidate "$MANIFEST" \
        --json "$GATE_OUT/report.json" --junit "$GATE_OUT/gates.xml" --summary "$GATE_OUT/summary.md"
    code=$?
    printf '%s\n' "$code" > "$GATE_OUT/exit-code"
    if [ -n "${GITHUB_STEP_SUMMARY:-}" ] && [ -f "$GATE_OUT/summary.md" ]; then
        cat "$GATE_OUT/summary.md" >> "$GITHUB_STEP_SUMMARY"
    fi
    exit "$code"
    ;;
*)
    echo "usage: MANIFEST=path/to/manifest.yaml $0 key|check" >&2
    exit 2
    ;;
esac
