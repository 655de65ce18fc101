# Session 3, GPU run C: the autotune GPU tests (one GPU, Dask), then tutorials 04 and 03 with outputs, as time allows.
LOGS=/tmp/c; WITH_KERNEL=1; source tools/gpu/common.sh
KERNELLAB_ARTIFACTS=/tmp/c timeout 100 python3 -m pytest -p no:cacheprovider -m gpu -q -rs -s tests/gpu/test_autotune_gpu.py > /tmp/c/autotune.txt 2>&1; echo "autotune rc=$? $(( $(date +%s) - T0 )) s"
timeout 65 python3 tools/gpu/run_notebooks.py /tmp/c notebooks/04-layernorm.py > /tmp/c/nb04.log 2>&1; echo "04 rc=$? $(( $(date +%s) - T0 )) s"
timeout 70 python3 tools/gpu/run_notebooks.py /tmp/c notebooks/03-reductions-softmax.py > /tmp/c/nb03.log 2>&1; echo "03 rc=$? $(( $(date +%s) - T0 )) s"
tar czf $OUT/c.tgz -C /tmp c
grep -E "passed|failed|Error" /tmp/c/autotune.txt | tail -5
tail -2 /tmp/c/nb04.log /tmp/c/nb03.log
