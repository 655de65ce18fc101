# Session 10, run B (issue 14): run A again with its table (a print fixed), y stored under L2 evict_last / evict_first policies in the cell, one-warp blocks, and a read-only flush beside the write flush; three shapes.
# Then DRAM bytes per kernel after a flush (ncu), 4096 x 1024.
LOGS=/tmp/s10b; source tools/gpu/common.sh
export TORCHINDUCTOR_CACHE_DIR=$LOGS/inductor
step bench 360 python3 tools/gpu/small_rows.py --rep-ms 25
step ncu 240 ncu --nvtx --nvtx-include "probe/" --cache-control none --csv --log-file $LOGS/ncu.csv \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__registers_per_thread,launch__grid_size,launch__block_size \
    python3 tools/gpu/small_rows.py --ncu --shapes 4096x1024
python3 tools/gpu/small_rows.py --read-ncu $LOGS/ncu.csv --order $LOGS/ncu.log > $LOGS/ncu_table.txt 2>&1
rm -rf $LOGS/inductor/aotautograd $LOGS/inductor/fxgraph
tar czf $OUT/s10b.tgz -C /tmp s10b
grep "inductor best" $LOGS/bench.log; tail -5 $LOGS/ncu.log
cat $LOGS/ncu_table.txt
sed -n '/^== table/,$p' $LOGS/bench.log | grep -v '^$'
tail -3 $LOGS/bench.log
