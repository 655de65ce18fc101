# Session 10, run A (issue 14): the small shapes' floor. Copy probes, tutorial 04's kernels and Inductor's in one bench
# (bf16 4096 x 1024 and 4096 x 4096), Inductor's chosen configs, then DRAM bytes per kernel after a flush (ncu).
LOGS=/tmp/s10a; source tools/gpu/common.sh
export TORCHINDUCTOR_CACHE_DIR=$LOGS/inductor
step bench 240 python3 tools/gpu/small_rows.py --rep-ms 25
step ncu 240 ncu --nvtx --nvtx-include "probe/" --cache-control none --csv --log-file $LOGS/ncu.csv \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__registers_per_thread,launch__grid_size,launch__block_size \
    python3 tools/gpu/small_rows.py --ncu --shapes 4096x1024
python3 tools/gpu/small_rows.py --read-ncu $LOGS/ncu.csv > $LOGS/ncu_table.txt 2>&1
rm -rf $LOGS/inductor/aotautograd $LOGS/inductor/fxgraph
tar czf $OUT/s10a.tgz -C /tmp s10a
grep "inductor best" $LOGS/bench.log; tail -5 $LOGS/ncu.log
cat $LOGS/ncu_table.txt
sed -n '/^== table/,$p' $LOGS/bench.log | grep -v '^$'
tail -3 $LOGS/bench.log
