#!/usr/bin/env bash
# Build the release artefacts into OUTDIR: the sdist, then one wheel per platform, each
# cross-compiled from that sdist with the pinned Zig and checked with auditwheel.
#
#   uv run scripts/build-wheels.sh OUTDIR [PLATFORM...]
#
# PLATFORM is a wheel platform tag of hatch_build.PLATFORMS; by default all of them:
# manylinux_2_17_x86_64 manylinux_2_17_aarch64 musllinux_1_2_x86_64 musllinux_1_2_aarch64.
# Needs uv (to build) and the dev environment's python with auditwheel (hence `uv run`).
# Fails, leaving no wheel in OUTDIR for that platform, when a wheel needs a newer symbol
# than its tag allows (scripts/check_wheel.py).
set -euo pipefail

if [ "$#" -lt 1 ]; then
  echo "usage: $0 OUTDIR [PLATFORM...]" >&2
  exit 2
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$1"
out="$(cd "$1" && pwd)"
shift
if [ "$#" -gt 0 ]; then
  platforms=("$@")
else
  platforms=(manylinux_2_17_x86_64 manylinux_2_17_aarch64 musllinux_1_2_x86_64 musllinux_1_2_aarch64)
fi

# `uv run` exports UV (its own path); otherwise uv on PATH, else the uv Python package.
if [ -n "${UV:-}" ]; then
  uv=("$UV")
elif command -v uv >/dev/null 2>&1; then
  uv=(uv)
else
  uv=(python3 -m uv)
fi
if ! python -c "import auditwheel" 2>/dev/null; then
  echo "$0: auditwheel is not importable by $(command -v python); run it with uv run" >&2
  exit 2
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"${uv[@]}" build --quiet --sdist --out-dir "$work/sdist" "$root"
sdist=("$work"/sdist/*.tar.gz)
cp "${sdist[0]}" "$out/"
echo "sdist: $(basename "${sdist[0]}")"

for platform in "${platforms[@]}"; do
  # The hook reads the platform from the environment and cross-compiles for it.
  DATASET_RT_PLATFORM="$platform" "${uv[@]}" build --quiet --wheel \
    --out-dir "$work/$platform" "${sdist[0]}"
  wheels=("$work/$platform"/*.whl)
  if [ "${#wheels[@]}" -ne 1 ]; then
    echo "$0: expected one wheel for $platform, got: ${wheels[*]}" >&2
    exit 1
  fi
  python "$root/scripts/check_wheel.py" "${wheels[0]}" --platform "$platform"
  mv "${wheels[0]}" "$out/"
done
