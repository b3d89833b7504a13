export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
t0=$(date +%s)
echo "== kda output floors"; timeout -k 5 -s INT 200 python bench/kernel_variants.py --family delta --decay key --T 8192 --variants bench/results/h200_2026-12-05b/variants_kdaout.json --out $OUT/kdaout 2>&1 | grep -v -i warn | tail -8
echo "t=$(( $(date +%s)-t0 ))"
for T in 16384; do for tree in old new; do d=$PWD; [ $tree = old ] && d=$OLD
echo "== probe $tree T=$T"; (cd $d && PYTHONPATH=$d timeout -k 5 -s INT 120 python bench/probe.py --specs simple_gla --T $T --top 6 --out $OUT/probe_${tree}_$T 2>&1 | grep -v -i warn | grep -o '"fwd_ms": [0-9.]*\|"fwdbwd_ms": [0-9.]*\|"[a-z0-9_]*state_[fb]wd": [0-9.]*\|"[a-z0-9_]*chunk_sums": [0-9.]*' | tr '\n' ' '; echo); done; done
echo "t=$(( $(date +%s)-t0 ))"
