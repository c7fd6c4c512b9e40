#!/bin/sh
# fashion_mnist refuses missing and corrupt data with a message that names the file, what is
# wrong and the Debian package to install, and exits non-zero without hanging.
#   fashion_mnist_bad_data.sh <fashion_mnist binary>
set -u
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
status=0

expect() {  # expect <description> <pattern> <data dir>
  out=$(timeout 60 "$bin" --epochs 1 --log-every 0 --data "$3" 2>&1)
  code=$?
  if [ $code -eq 0 ] || [ $code -eq 124 ]; then
    echo "FAIL ($1): exit status $code"; status=1
  elif ! printf '%s' "$out" | grep -q -- "$2"; then
    echo "FAIL ($1): no '$2' in: $out"; status=1
  else
    echo "ok ($1): $out"
  fi
}

expect "missing directory" "Install Debian's dataset-fashion-mnist" "$dir/nowhere"

mkdir "$dir/truncated"
cp /usr/share/datasets/fashion-mnist/*.gz "$dir/truncated/" 2>/dev/null || {
  echo "FAIL: dataset-fashion-mnist is not installed" \
       "(examples/CMakeLists.txt registers this test only where it is)"; exit 1; }
head -c 100000 /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz \
  > "$dir/truncated/train-images-idx3-ubyte.gz"
expect "truncated gzip" "train-images-idx3-ubyte.gz is corrupt (unexpected end of file)" "$dir/truncated"

mkdir "$dir/not_idx"
cp /usr/share/datasets/fashion-mnist/*.gz "$dir/not_idx/"
printf 'this is not an IDX file at all' | gzip > "$dir/not_idx/t10k-labels-idx1-ubyte.gz"
expect "not IDX" "t10k-labels-idx1-ubyte.gz is not a valid IDX file" "$dir/not_idx"

mkdir "$dir/mismatch"
cp /usr/share/datasets/fashion-mnist/*.gz "$dir/mismatch/"
cp /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz "$dir/mismatch/train-labels-idx1-ubyte.gz"
expect "labels of another split" "60000 images but 10000 labels" "$dir/mismatch"
exit $status
