#!/usr/bin/env bash
# Set up zhantune in .venv: installs torch==2.13.0 only where the venv has no torch (a CPU build is
# served from local disk on the project's machines); never replaces a torch that is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
    .venv/bin/pip install --quiet "torch==2.13.0"
fi
# the project's packages, unless this pyproject.toml was installed already and its imports work (make demo
# again: a newcomer's second run spent 36 s here reinstalling what was there)
STAMP=.venv/.zhantune-setup
WANT=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ] \
        || ! .venv/bin/python -c "import zhantune, hydra, optuna, sqlalchemy, alembic, rich, pytest" >/dev/null 2>&1; then
    .venv/bin/pip install --quiet -e ".[dev]"
    echo "$WANT" > "$STAMP"
fi
.venv/bin/python -c "import torch, zhantune; print('zhantune', zhantune.__version__, 'torch', torch.__version__)"
