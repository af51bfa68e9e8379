#!/usr/bin/env bash
# Installs the MCP servers that tests/mcp.rs runs, all written by others: the reference
# server-everything from npm (tests/mcp-servers/package-lock.json), and the Python `mcp`
# SDK from PyPI (tests/mcp-servers/requirements.txt, every version pinned) in a venv for
# tests/mcp-servers/bumblehive_test_server.py. A second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x tests/mcp-servers/node_modules/.bin/mcp-server-everything ]; then
  (cd tests/mcp-servers && npm ci --no-audit --no-fund)
fi

venv=${BUMBLEHIVE_MCP_VENV:-$HOME/.cache/bumblehive-mcp/venv}
if [ ! -x "$venv/bin/pip" ]; then
  python3 -m venv "$venv"
fi
if ! diff -q <("$venv/bin/pip" freeze 2>/dev/null | sort) <(sort tests/mcp-servers/requirements.txt) >/dev/null; then
  "$venv/bin/pip" install -q --disable-pip-version-check -r tests/mcp-servers/requirements.txt
fi
echo "MCP test servers: $(pwd)/tests/mcp-servers/node_modules, $venv"
