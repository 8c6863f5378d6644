#!/usr/bin/env bash
# ddp-prepare-data: stages a checked copy, is idempotent, and refuses corrupt or mismatched input
# with the documented exit codes and a message naming the file.
set -uo pipefail
tool="$(cd "$(dirname "$0")/../../docker" && pwd)/ddp-prepare-data"
source_dir=/usr/share/datasets/fashion-mnist
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0

expect() {  # expect NAME CODE PATTERN -- COMMAND...
  local name=$1 code=$2 pattern=$3
  shift 4
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [[ $rc -eq $code ]] && grep -q -- "$pattern" <<<"$out"; then
    echo "ok   $name"
    passed=$((passed + 1))
  else
    echo "FAIL $name: exit $rc (want $code), output:"
    sed 's/^/       /' <<<"$out"
    failed=$((failed + 1))
  fi
}

[[ -d $source_dir ]] || { echo "FAIL: $source_dir missing: scripts/install-deps installs dataset-fashion-mnist"; exit 1; }
dest=$work/shared/data/fashion-mnist
expect "stages the dataset" 0 "staged 4 files" -- "$tool" --dest "$dest" --create-dir "$work/shared/checkpoints"
if cmp -s "$source_dir/train-images-idx3-ubyte.gz" "$dest/train-images-idx3-ubyte.gz" &&
   [[ -d $work/shared/checkpoints && $(stat -c %a "$dest") == 755 ]]; then
  echo "ok   staged copy is identical, world-readable, checkpoint dir created"; passed=$((passed + 1))
else
  echo "FAIL staged copy differs, is not world-readable, or no checkpoint dir"; failed=$((failed + 1))
fi
expect "second run is a no-op" 0 "nothing to do" -- "$tool" --dest "$dest"
echo garbage >"$dest/t10k-labels-idx1-ubyte.gz"
expect "a damaged staged copy is replaced" 0 "staged 4 files" -- "$tool" --dest "$dest"
[[ -z $(find "$work/shared/data" -name '.*staging*') ]] && { echo "ok   no staging leftovers"; passed=$((passed + 1)); } ||
  { echo "FAIL staging directory left behind"; failed=$((failed + 1)); }

bad=$work/bad
mkdir "$bad" && cp "$source_dir"/*.gz "$bad/"
head -c 100000 "$source_dir/train-images-idx3-ubyte.gz" >"$bad/train-images-idx3-ubyte.gz"
expect "truncated gzip is exit 65, names the file" 65 "train-images-idx3-ubyte.gz is not a complete gzip" -- "$tool" --source "$bad" --dest "$work/x"
cp "$source_dir"/*.gz "$bad/" && cp "$source_dir/t10k-images-idx3-ubyte.gz" "$bad/train-labels-idx1-ubyte.gz"
expect "wrong IDX magic is exit 65" 65 "expected 2049 (labels)" -- "$tool" --source "$bad" --dest "$work/x"
cp "$source_dir"/*.gz "$bad/" && cp "$source_dir/t10k-labels-idx1-ubyte.gz" "$bad/train-labels-idx1-ubyte.gz"
expect "image/label count mismatch is exit 65" 65 "60000 images but .* 10000 labels" -- "$tool" --source "$bad" --dest "$work/x"
cp "$source_dir"/*.gz "$bad/" && rm "$bad/t10k-images-idx3-ubyte.gz"
expect "missing file is exit 65" 65 "t10k-images-idx3-ubyte.gz is missing" -- "$tool" --source "$bad" --dest "$work/x"
[[ ! -e $work/x ]] && { echo "ok   nothing written for rejected input"; passed=$((passed + 1)); } ||
  { echo "FAIL rejected input left $work/x"; failed=$((failed + 1)); }
expect "no --dest is exit 64" 64 "--dest is required" -- "$tool"
expect "unknown flag is exit 64" 64 "unknown argument '--nope'" -- "$tool" --nope
expect "--help documents the flags" 0 "--create-dir DIR" -- "$tool" --help

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
