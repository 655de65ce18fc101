# Session 5, run B: the exercise grader tests the first run's time limit cut off (from 05-register-tiles.strided_columns
# on), the persistent attention with 2 consumer warpgroups at d = 64 (issue 12), and the wgmma epilogue candidates
# without the one that faulted in run A (its fault ended the CUDA context for the rest; issue 13).
LOGS=/tmp/s5b; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step exercises 230 python3 -m pytest -p no:cacheprovider -m gpu -v -rf --tb=short tests/gpu/test_exercises_gpu.py -k "(test_every_wrong_variant and (strided_columns or 05-smem-tiles or 06-)) or names or faulting"
step attention 120 python3 tools/gpu/try_attention.py
step wgmma1 70 python3 tools/gpu/try_wgmma.py --only "cell now" tmastore
step wgmma2 60 python3 tools/gpu/try_wgmma.py --only "128x128" "TMA st"
export OUT=$OUT_DIR
tar czf $OUT/s5b.tgz -C /tmp s5b
grep -cE "PASSED" $LOGS/exercises.log; grep -E "FAILED|ERROR|passed|failed" $LOGS/exercises.log | tail -8
tail -16 $LOGS/attention.log
for f in wgmma1 wgmma2; do grep -v -E "cupy_backends|driver.pyx|Exception ignored|^Traceback|^  File" $LOGS/$f.log | tail -14; done
