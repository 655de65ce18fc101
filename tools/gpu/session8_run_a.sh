# Session 8, run A: Nsight Compute on the row kernels at the shapes issue 14 still misses (tools/gpu/norm_stalls.py).
LOGS=/tmp/s8a; source tools/gpu/common.sh
step stalls 400 python3 tools/gpu/norm_stalls.py $LOGS/ncu
tar czf $OUT/s8a.tgz -C /tmp s8a
tail -c 11000 $LOGS/stalls.log
