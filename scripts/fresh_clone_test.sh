#!/usr/bin/env bash
# Proves the README's promise: from a fresh clone of HEAD, in a clean environment (no venv, no
# PYTHONPATH, no RECOVERD_* or ETCD* variables), `make test` and `make demo` both pass.
# Uncommitted changes are not included: commit first. Exits non-zero on the first failure.
set -euo pipefail

repo="$(git -C "$(dirname "${BASH_SOURCE[0]}")/.." rev-parse --show-toplevel)"
head="$(git -C "$repo" rev-parse HEAD)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
clone="$work/recoverd"

git clone --quiet "$repo" "$clone"
git -C "$clone" checkout --quiet "$head"
echo "fresh clone of $head in $clone"

python_dir="$(dirname "$(command -v python3)")"
clean_env=(env -i "HOME=$HOME" "PATH=/usr/local/bin:/usr/bin:/bin:$python_dir")

step() {
  local name="$1"
  local start=$SECONDS
  echo "==> make $name"
  if ! (cd "$clone" && "${clean_env[@]}" make "$name"); then
    echo "FAILED: make $name after $((SECONDS - start))s" >&2
    exit 1
  fi
  echo "==> make $name: ok in $((SECONDS - start))s"
}

step test
step demo
echo "fresh clone: make test and make demo passed"
