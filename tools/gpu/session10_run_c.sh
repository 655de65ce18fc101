# Session 10, run C (issue 14): candidate norm_staged (rows brought into shared memory by cp.async.bulk, persistent
# blocks) against the cell, torch.compile and torch's copy, write and read flushes (tools/gpu/try_staged.py).
LOGS=/tmp/s10c; source tools/gpu/common.sh
step staged 420 python3 tools/gpu/try_staged.py
tar czf $OUT/s10c.tgz -C /tmp s10c
grep -E "WRONG|Error|error" $LOGS/staged.log | head -20
sed -n '/^== table/,$p' $LOGS/staged.log | grep -v '^$'
tail -3 $LOGS/staged.log
