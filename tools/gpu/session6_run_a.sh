# Session 6, run A (issue 14): tutorials 03/04 kernels on the GPU after the softmax 128-byte rows and the w/b ring,
# the softmax table (both dtypes), and try_norms on the few-rows and fp32 cases left.
LOGS=/tmp/s6a; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step tests 150 python3 -m pytest -p no:cacheprovider -m gpu -q -rf --tb=short tests/gpu/test_memory_bound_gpu.py
step softmax 200 python3 benchmarks/memory_bound.py --ops softmax
step norms 200 python3 tools/gpu/try_norms.py --only "bfloat16 3x100003,float32 3x100003,float32 4096x32768,float32 4096x1024"
export OUT=$OUT_DIR
tar czf $OUT/s6a.tgz -C /tmp s6a
tail -3 $LOGS/tests.log; tail -40 $LOGS/softmax.log; tail -45 $LOGS/norms.log
