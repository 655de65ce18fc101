# Session 10, run F: tutorial 00 top to bottom on the H100 (its graders now run the simulator's initcheck beside
# racecheck and synccheck), the executed notebook kept.
LOGS=/tmp/s10f; WITH_KERNEL=1; source tools/gpu/common.sh
step nb00 240 python3 tools/gpu/run_notebooks.py $LOGS notebooks/00-puzzles.py
cp $LOGS/*.ipynb $OUT/ 2>/dev/null
tar czf $OUT/s10f.tgz -C /tmp s10f
tail -3 $LOGS/nb00.log
