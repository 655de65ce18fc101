# Session 9, run I (issue 14): w and b prefetched into L1 next to x's loads (try_norms new+pf, new+pfnc).
LOGS=/tmp/s9i; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step pf 150 python3 tools/gpu/try_norms.py --only "1024x262144,4096x32768" --variants "new+pf" --no-compile
export OUT=$OUT_DIR
tar czf $OUT/s9i.tgz -C /tmp s9i
sed -n '/^op  /,$p' $LOGS/pf.log | grep -v '^$'
