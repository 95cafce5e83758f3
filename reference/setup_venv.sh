#!/usr/bin/env bash
# Creates the oracle virtual environment (only needed to REGENERATE fixtures; the C++ tests
# never need Python). Usage: reference/setup_venv.sh [VENV_DIR]  (default: <repo>/.venv-ref,
# which the repo's .gitignore ignores). If /work/venvs/ref already holds the pinned versions,
# point VENV_DIR there or just use /work/venvs/ref/bin/python directly.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${1:-$here/../.venv-ref}"
python3 -m venv "$venv"
"$venv/bin/pip" install --upgrade pip
# CPU wheels are enough: every oracle runs on CPU in fp32.
"$venv/bin/pip" install -r "$here/requirements.txt"
# deepseek-recipe (pinned): the chat fixtures' oracle (reference/chat/gen_*_fixtures.py).
"$venv/bin/pip" install -r "$here/chat/requirements.txt"
"$venv/bin/python" "$here/hf_oracle.py" probe
echo "oracle venv ready: $venv/bin/python"
