#!/usr/bin/env bash
# mypy over the installed package names. services/node-agent is not a valid module path, so mypy
# cannot map folders to packages itself: build a symlink tree that mirrors pyproject's package-dir
# mapping (recoverd <- libs/recoverd, recoverd.agent <- services/node-agent, ...) and check that.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tree="$root/build/typecheck"
rm -rf "$tree"
mkdir -p "$tree/recoverd"
for entry in "$root"/libs/recoverd/*; do ln -s "$entry" "$tree/recoverd/"; done
ln -s "$root/services/coordinator" "$tree/recoverd/coordinator"
ln -s "$root/services/strategy" "$tree/recoverd/strategy"
ln -s "$root/services/node-agent" "$tree/recoverd/agent"
ln -s "$root/services/cli" "$tree/recoverd/cli"
ln -s "$root/services/gateway" "$tree/recoverd/gateway"
ln -s "$root/libs/taskd_client" "$tree/taskd_client"
ln -s "$root/libs/taskd" "$tree/taskd"
cd "$root"
MYPYPATH="$tree" "${MYPY:-$root/.venv/bin/mypy}" -p recoverd -p taskd_client -p taskd "$@"
