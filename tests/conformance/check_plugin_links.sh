#!/usr/bin/env bash
# Fails when a backend plugin exports or imports anything of the tensor, bind, bench or
# scene layers, or links libpinstage itself: a plugin links base only.
set -euo pipefail
plugin=$1
symbols=$(nm -DC "$plugin")
libs=$(ldd "$plugin")
bad=$(grep -Ei 'qwen3|golden|::ab::|bench|Binder|BindOptions|Tensor|TaskArgs|HostAllocator|Storage|safetensors|fixture|scene' <<<"$symbols" || true)
if [ -n "$bad" ]; then
  echo "$plugin has symbols of layers above base:"; echo "$bad"; exit 1
fi
if grep -E 'libpinstage\.so|libpinstage_qwen3|scene' <<<"$libs"; then
  echo "$plugin links a library above base"; exit 1
fi
grep -q 'libpinstage_base.so' <<<"$libs" || { echo "$plugin does not link libpinstage_base"; exit 1; }
echo "$plugin: links base only ($(grep -c . <<<"$symbols") dynamic symbols checked)"
