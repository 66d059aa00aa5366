#!/usr/bin/env bash
# The compiled events decoder (tracekit/ingest/_events.c) under AddressSanitizer and
# UndefinedBehaviorSanitizer: builds an instrumented copy, swaps it in for the tests that feed it
# generated, hostile and real traces, and puts the normal build back. Fails on any sanitizer report.
#   bash scripts/check_decoder_sanitizers.sh        (about 10 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
so=$(python -c "import tracekit.ingest._events as e; print(e.__file__)")
inc=$(python -c "import sysconfig; print(sysconfig.get_paths()['include'])")
tmp=$(mktemp -d)
trap 'cp "$tmp/normal.so" "$so"; rm -rf "$tmp"' EXIT
cp "$so" "$tmp/normal.so"
gcc -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -std=c11 \
    -shared -fPIC -I"$inc" tracekit/ingest/_events.c -o "$so"
ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)" \
    python -m pytest -q -p no:cacheprovider tests/test_ingest_fastpath.py tests/test_fuzz_ingest.py \
    tests/test_ingest_hostile.py "$@"
