#!/usr/bin/env bash
# The GPU smoke command: ten minutes on one GPU that say whether sglang-slo works there.
#   benchmarks/experiments/gpu_smoke.sh --help      what it checks, and its options
#   benchmarks/experiments/gpu_smoke.sh             set up if needed (./slo setup), then run every check
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${SGLANG_SLO_VENV:-$ROOT/.venv}/bin/python"
case " $* " in
  *" -h "* | *" --help "*) [ -x "$PY" ] || PY=python3 ;;  # the help needs no set-up
  *) "$ROOT/setup/bootstrap.sh" ;;
esac
cd "$ROOT"
exec "$PY" -m benchmarks.experiments.gpu_smoke "$@"
