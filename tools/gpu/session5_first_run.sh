# Prepared at the end of session 4 for the next session's first GPU call (none of it has run yet): the candidates
# verified only in the CPU emulator, and the GPU checks the device budget did not reach.
#   - try_wgmma: epilogue-overlap candidates for the wgmma matmul (TMA store; ping-pong), issue 13
#   - try_attention: the persistent fa3 against the tutorial's, small N, issue 12
#   - the exercise graders not run on a GPU yet (five 00 variants after the grader fix; 05/06 variants; 3 tests)
#   - tutorial 00 top to bottom (its %%gpu cell re-grades the puzzles on the GPU), issue 15
LOGS=/tmp/s5; WITH_KERNEL=1; source tools/gpu/common.sh
OUT_DIR=$OUT; export OUT=$LOGS
step wgmma 130 python3 tools/gpu/try_wgmma.py
step attention 110 python3 tools/gpu/try_attention.py
export OUT=$OUT_DIR
step exercises 150 python3 -m pytest -p no:cacheprovider -m gpu -v -rf --tb=short tests/gpu/test_exercises_gpu.py -k "00-cumsum or 00-flip or 00-histogram or 05-register-tiles or 05-smem-tiles or 06- or names or faulting"
step nb00 180 python3 tools/gpu/run_notebooks.py $LOGS notebooks/00-puzzles.py
tar czf $OUT/s5.tgz -C /tmp s5
for f in wgmma attention; do tail -22 $LOGS/$f.log; done
grep -c PASSED $LOGS/exercises.log; grep -E "FAILED|ERROR" $LOGS/exercises.log | head; tail -2 $LOGS/nb00.log
