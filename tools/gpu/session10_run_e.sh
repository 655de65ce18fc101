# Session 10, run E: the whole GPU test suite (pytest -m gpu tests/gpu), a health check of main on the H100.
LOGS=/tmp/s10e; WITH_KERNEL=1; source tools/gpu/common.sh
step gpu 540 python3 -m pytest -p no:cacheprovider -m gpu -q -rfs --tb=short --durations=15 tests/gpu
tar czf $OUT/s10e.tgz -C /tmp s10e
grep -E "passed|failed|FAILED|ERROR|SKIPPED" $LOGS/gpu.log | tail -30
