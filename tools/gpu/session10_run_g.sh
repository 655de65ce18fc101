# Session 10, run G: the GPU grader on tutorial 00's flip and histogram (hardware, compute-sanitizer, and the
# simulator's racecheck / synccheck / initcheck beside them).
LOGS=/tmp/s10g; source tools/gpu/common.sh
step ex 200 python3 -m pytest -p no:cacheprovider -m gpu -q -rf --tb=short tests/gpu/test_exercises_gpu.py -k "00-flip or 00-histogram"
tar czf $OUT/s10g.tgz -C /tmp s10g
tail -5 $LOGS/ex.log
