# Session 8, run B: the st.async exchange of tutorials 03/04's cluster kernels: GPU tests (compute-sanitizer too),
# then both exchanges timed in one run (tools/gpu/try_exchange.py).
LOGS=/tmp/s8b; source tools/gpu/common.sh
step tests 220 python3 -m pytest -p no:cacheprovider -m gpu -q -rf --tb=short -x tests/gpu/test_memory_bound_gpu.py
step exchange 330 python3 tools/gpu/try_exchange.py
tar czf $OUT/s8b.tgz -C /tmp s8b
grep -E "passed|failed|FAILED|Error" $LOGS/tests.log | tail -6; tail -c 6000 $LOGS/exchange.log
