# Session 9, run E (issue 14): x loaded past L1 and first out of L2 (try_norms new+ef; new+nc: L1 only) against the
# cell at its plans, with torch.compile, at the shapes that try_norms has.
LOGS=/tmp/s9e; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step ef 280 python3 tools/gpu/try_norms.py --only "4096x1024,4096x4096,1024x262144,4096x32768" --variants "new+" --rep-ms 25 --budget-s 200
export OUT=$OUT_DIR
tar czf $OUT/s9e.tgz -C /tmp s9e
sed -n '/^op  /,$p' $LOGS/ef.log | grep -v '^$'
