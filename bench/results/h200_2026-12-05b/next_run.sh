nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src
t0=$(date +%s)
for T in 16384 8192; do for tree in old new; do d=$PWD; [ $tree = old ] && d=$OLD
echo "== probe $tree T=$T"; (cd $d && PYTHONPATH=$d timeout -k 5 -s INT 50 python bench/probe.py --specs simple_gla --T $T --top 6 --out $OUT/probe_${tree}_$T 2>&1 | grep -v -i warn | grep -o '"fwd_ms": [0-9.]*\|"fwdbwd_ms": [0-9.]*\|"[a-z0-9_]*state_[fb]wd": [0-9.]*\|"[a-z0-9_]*chunk_sums": [0-9.]*' | tr '\n' ' '; echo); done; done
echo "t=$(( $(date +%s)-t0 ))"
echo "== check"; PYTHONPATH=$PWD timeout -k 5 -s INT 60 python /tmp/L.py check simple_gla --device cuda 2>&1 | grep -v Warn | tail -1
echo "t=$(( $(date +%s)-t0 ))"
echo "== bench vs FLA"; PYTHONPATH=$PWD timeout -k 5 -s INT 60 python /tmp/L.py bench simple_gla --vs fla --lengths 16384 --no-decode --out $OUT/bench 2>&1 | grep -v Warn | tail -6
echo "t=$(( $(date +%s)-t0 ))"
