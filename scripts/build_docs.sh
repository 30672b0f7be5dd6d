#!/usr/bin/env bash
# Build the API reference site (mkdocs.yml, docs/) from the docstrings; installs nothing and
# fetches nothing. Usage: scripts/build_docs.sh [SITE_DIR]  (default: site; a relative path is
# taken from the repository root). Needs the docs extra: pip install -e '.[docs]'.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -x .venv/bin/mkdocs ]]; then
    echo "build_docs: .venv/bin/mkdocs not found; install the docs extra: .venv/bin/pip install -e '.[docs]'" >&2
    exit 1
fi
# --strict: any warning (a broken link, a docstring mkdocstrings cannot render) fails the build.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "${1:-site}"
