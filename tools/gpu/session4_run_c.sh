# Session 4, GPU run C1: tutorials 05 and 06 top to bottom with outputs (after the session's kernel changes).
LOGS=/tmp/c; WITH_KERNEL=1; source tools/gpu/common.sh
step nb05 230 python3 tools/gpu/run_notebooks.py /tmp/c notebooks/05-matmul.py
step nb06 230 python3 tools/gpu/run_notebooks.py /tmp/c notebooks/06-tensor-cores.py
step nb04 100 python3 tools/gpu/run_notebooks.py /tmp/c notebooks/04-layernorm.py
tar czf $OUT/c.tgz -C /tmp c
for f in nb05 nb06 nb04; do tail -3 /tmp/c/$f.log; done
