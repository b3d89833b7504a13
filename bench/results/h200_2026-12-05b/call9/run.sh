bash bench/results/h200_2026-12-05b/next_run.sh
t0=$(date +%s)
echo "== kda output floors"; timeout -k 5 -s INT 150 python bench/kernel_variants.py --family delta --decay key --T 8192 --variants bench/results/h200_2026-12-05b/variants_kdaout.json --out $OUT/kdaout 2>&1 | grep -v -i warn | tail -8
echo "t=$(( $(date +%s)-t0 ))"
echo "== bench all"; PYTHONPATH=$PWD timeout -k 5 -s INT 200 python /tmp/L.py bench simple_gla mamba2 --vs fla --no-decode --out $OUT/bench_all 2>&1 | grep -v Warn | tail -14
echo "t=$(( $(date +%s)-t0 ))"
