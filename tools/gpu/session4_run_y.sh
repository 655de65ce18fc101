# Session 4, GPU run Y: tutorial 03 after the +inf softmax fix, the exercise graders on the GPU (every reference
# solution; the wrong variants of tutorials 00 and 03-06), tutorial 04 after its new row plans.
LOGS=/tmp/y; WITH_KERNEL=1; source tools/gpu/common.sh
step nb03 90 python3 tools/gpu/run_notebooks.py /tmp/y notebooks/03-reductions-softmax.py
step exercises 330 python3 -m pytest -p no:cacheprovider -m gpu -v -rf --tb=short tests/gpu/test_exercises_gpu.py -k "not variant or 00- or 03- or 04- or 05- or 06-"
step nb04 100 python3 tools/gpu/run_notebooks.py /tmp/y notebooks/04-layernorm.py
tar czf $OUT/y.tgz -C /tmp y
tail -2 /tmp/y/nb03.log; tail -2 /tmp/y/nb04.log
grep -c PASSED /tmp/y/exercises.log; grep -E "FAILED|ERROR" /tmp/y/exercises.log | head -20; tail -3 /tmp/y/exercises.log
