#!/usr/bin/env bash
# Installs the ACP clients that tests/acp.rs drives `bumblehive acp` with, all written by
# others: the official TypeScript SDK from npm (tests/acp/package-lock.json, compiled with
# tsc into tests/acp/dist), and the official Python SDK from PyPI (tests/acp/requirements.txt,
# every version pinned) in a venv; and the real ACP agents that tests/acp_real.rs runs as
# background children (tests/acp/agents/package-lock.json: claude-agent-acp, which carries
# Claude Code through the Claude Agent SDK, and codex-acp, which carries Codex), into
# tests/acp/agents/node_modules (gitignored). A second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -d tests/acp/node_modules/@agentclientprotocol/sdk ]; then
  (cd tests/acp && npm ci --no-audit --no-fund)
fi
if [ ! -f tests/acp/dist/client.js ] || [ tests/acp/client.ts -nt tests/acp/dist/client.js ]; then
  (cd tests/acp && npm run --silent build)
fi

if [ ! -x tests/acp/agents/node_modules/.bin/claude-agent-acp ] \
  || [ ! -x tests/acp/agents/node_modules/.bin/codex-acp ] \
  || [ tests/acp/agents/package-lock.json -nt tests/acp/agents/node_modules/.package-lock.json ]; then
  # claude-agent-acp asks for Node.js 22 in its package.json and runs on 20 (tested here).
  (cd tests/acp/agents && npm ci --no-audit --no-fund --loglevel=error)
fi

venv=${BUMBLEHIVE_ACP_VENV:-$HOME/.cache/bumblehive-acp/venv}
if [ ! -x "$venv/bin/pip" ]; then
  python3 -m venv "$venv"
fi
if ! diff -q <("$venv/bin/pip" freeze 2>/dev/null | sort) <(sort tests/acp/requirements.txt) >/dev/null; then
  "$venv/bin/pip" install -q --disable-pip-version-check -r tests/acp/requirements.txt
fi
echo "ACP test clients: $(pwd)/tests/acp/dist/client.js, $venv; agents: $(pwd)/tests/acp/agents/node_modules/.bin"
