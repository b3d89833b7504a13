nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
export PYTHONPATH=$PWD TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src
t0=$(date +%s)
for T in 16384 8192; do echo "== variants T=$T"; timeout -k 5 -s INT 150 python bench/kernel_variants.py --family additive --decay scalar --T $T --variants bench/results/h200_2026-12-05b/call2/variants_walk.json --out $OUT/variants 2>&1 | grep -v -i warn | tail -7; echo "t=$(( $(date +%s)-t0 ))"; done
echo "== probe simple_gla 16384"; timeout -k 5 -s INT 200 python bench/probe.py --specs simple_gla --T 16384 --fla --forward --top 8 --out $OUT/probe 2>&1 | grep -v -i warn | tail -40
echo "t=$(( $(date +%s)-t0 ))"
echo "== kda 64-step floors T=8192"; timeout -k 5 -s INT 150 python bench/kernel_variants.py --family delta --decay key --T 8192 --variants bench/results/h200_2026-12-05b/call2/variants_kda64.json --out $OUT/variants_kda 2>&1 | grep -v -i warn | tail -6
echo "t=$(( $(date +%s)-t0 ))"
