#!/usr/bin/env bash
# Compatibility run across torch releases (CPU runs; heavy: ~6 GB and ~100 s per venv,
# so not part of CI). Venvs are cached in $COMPAT_DIR. A machine-wide pip cap on torch
# (/etc/xdg/pip here) is lifted for these throwaway venvs only (PIP_CONSTRAINT=/dev/null).
# Results: benchmarks/results/compat-results.jsonl.
# Usage: PY=.venv/bin/python scripts/compat.sh [VERSION ...] (PY needs hatchling; default
# releases: 2.4.1 2.6.0 2.9.1 2.13.0 2.14.1 2.15.0)
# The whole test suite against one of these venvs: TESTING.md (ROCM_AUTOPATCH_TEST_TORCH_VENV).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
COMPAT_DIR=${COMPAT_DIR:-$HOME/.cache/rocm-autopatch-compat}
PY=${PY:-python3.11}
versions=("$@"); [ ${#versions[@]} -gt 0 ] || versions=(2.4.1 2.6.0 2.9.1 2.13.0 2.14.1 2.15.0)
mkdir -p "$COMPAT_DIR"; wheel_dir=$(mktemp -d)
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$wheel_dir" "$here"
out="$here/benchmarks/results/compat-results.jsonl"; : > "$out"
for v in "${versions[@]}"; do
  venv="$COMPAT_DIR/torch-$v"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torch, numpy" 2>/dev/null; then
    "$PY" -m venv "$venv" && PIP_CONSTRAINT=/dev/null "$venv/bin/pip" install -q "torch==$v" numpy
  fi
  "$venv/bin/pip" install -q --force-reinstall --no-deps "$wheel_dir"/*.whl
  for script in compat_checks.py capture_policy_repro.py capture_repro.py compat_report_verify.py; do
    extra=""; [ "$script" = capture_repro.py ] && extra="ROCM_AUTOPATCH_COMPILE_IN_CAPTURE=1"
    line=$(cd /tmp && env ROCM_AUTOPATCH=force $extra "$venv/bin/python" "$here/scripts/$script" 2>/tmp/compat-$v.err | tail -1) \
      || line="{\"torch\": \"$v\", \"script\": \"$script\", \"crashed\": true}"
    echo "{\"release\": \"$v\", \"script\": \"$script\", \"result\": $line}" | tee -a "$out"
  done
done
