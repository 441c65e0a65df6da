#!/usr/bin/env bash
# Compatibility run across torch releases (CPU builds; heavy: ~6 GB and ~100 s per venv,
# so not part of CI). Venvs are cached in $COMPAT_DIR. Results: compat-results.jsonl.
# Usage: scripts/compat.sh [VERSION ...]   (default: 2.4.1 2.6.0 2.9.1 2.13.0 2.14.1)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
COMPAT_DIR=${COMPAT_DIR:-$HOME/.cache/rocm-autopatch-compat}
PY=${PY:-python3.11}
versions=("$@"); [ ${#versions[@]} -gt 0 ] || versions=(2.4.1 2.6.0 2.9.1 2.13.0 2.14.1)
mkdir -p "$COMPAT_DIR"; wheel_dir=$(mktemp -d)
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$wheel_dir" "$here"
out="$here/compat-results.jsonl"; : > "$out"
for v in "${versions[@]}"; do
  venv="$COMPAT_DIR/torch-$v"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torch, wrapt" 2>/dev/null; then
    "$PY" -m venv "$venv" && "$venv/bin/pip" install -q "torch==$v" wrapt numpy
  fi
  "$venv/bin/pip" install -q --force-reinstall --no-deps "$wheel_dir"/*.whl
  for script in compat_checks.py capture_repro.py; do
    line=$(cd /tmp && ROCM_AUTOPATCH=force "$venv/bin/python" "$here/scripts/$script" 2>/tmp/compat-$v.err | tail -1) \
      || line="{\"torch\": \"$v\", \"script\": \"$script\", \"crashed\": true}"
    echo "{\"release\": \"$v\", \"script\": \"$script\", \"result\": $line}" | tee -a "$out"
  done
done
