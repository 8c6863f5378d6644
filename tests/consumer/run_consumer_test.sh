#!/usr/bin/env bash
# Installs the built project into a temporary prefix, then configures, builds and runs the
# consumer project against it with find_package(ddp).
#   run_consumer_test.sh <build-dir> <consumer-source-dir>
set -euo pipefail
build_dir=$1
source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
# The installed programs start from a prefix the loader does not search, with no
# LD_LIBRARY_PATH: they find libddp through their $ORIGIN-relative RUNPATH.
for program in ddprun train_mnist train_cifar10 evaluate; do
  [[ -x "$work/prefix/bin/$program" ]] || continue
  if ! env -u LD_LIBRARY_PATH "$work/prefix/bin/$program" --help >"$work/$program.out" 2>&1; then
    echo "consumer: the installed $program does not start from $work/prefix:" >&2
    cat "$work/$program.out" >&2
    exit 1
  fi
done
cmake -S "$source_dir" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/build" >/dev/null
export LD_LIBRARY_PATH="$work/prefix/lib:${LD_LIBRARY_PATH:-}"
"$work/build/consumer"
"$work/build/consumer_comm"
# The part links only what it uses: libddp_comm (and libddp_base), no trainer, data or models.
# (A static build has nothing to load: there the linker takes only the objects used.)
if compgen -G "$work/prefix/lib/libddp_comm.so*" >/dev/null; then
  needed=$(readelf -d "$work/build/consumer_comm" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  if ! grep -q '^libddp_comm\.so' <<<"$needed" ||
    grep -Eq '^libddp_(parallel|train)\.so' <<<"$needed"; then
    echo "consumer: consumer_comm, linked to ddp::comm alone, needs:" $needed >&2
    exit 1
  fi
fi
# The fabric backend is a module libddp loads from beside itself: it must be installed there.
if compgen -G "$work/prefix/lib/libddp_fabric.so.*" >/dev/null; then
  DDP_BACKEND=fabric "$work/build/consumer" | tee "$work/fabric.out"
  grep -q "consumer: fabric rank 0 of 1, sum ok=1" "$work/fabric.out"
else
  echo "consumer: no libddp_fabric installed (built with -DDDP_WITH_FABRIC=OFF): fabric not run"
fi
