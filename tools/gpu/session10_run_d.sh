# Session 10, run D: bench's flush_l2="clean" on the GPU (tests/gpu/test_bench_gpu.py, all of it), and
# tools/gpu/flush_effect.py through the new option.
LOGS=/tmp/s10d; source tools/gpu/common.sh
step tests 300 python3 -m pytest -p no:cacheprovider -m gpu -q -rf --tb=short tests/gpu/test_bench_gpu.py
step flush 150 python3 tools/gpu/flush_effect.py
tar czf $OUT/s10d.tgz -C /tmp s10d
tail -4 $LOGS/tests.log; sed -n '/^dtype/,$p' $LOGS/flush.log; tail -2 $LOGS/flush.log
