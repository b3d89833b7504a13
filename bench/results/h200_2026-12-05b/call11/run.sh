nvidia-smi --query-gpu=name --format=csv,noheader
export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
t0=$(date +%s)
echo "== kda output configs"; timeout -k 5 -s INT 170 python bench/kernel_variants.py --family delta --decay key --T 8192 --variants bench/results/h200_2026-12-05b/variants_kdaout_cfg.json --out $OUT/kdaout_cfg 2>&1 | grep -v -i warn | grep -o '"variant": "[^"]*"\|"output_kernel": [0-9.]*\|"sum": [0-9.]*' | paste -sd' ' | sed 's/"variant"/\n/g'
echo "t=$(( $(date +%s)-t0 ))"
echo "== probe kda fla"; timeout -k 5 -s INT 150 python bench/probe.py --specs kda --T 8192 --fla --forward --top 10 --out $OUT/probe_kda 2>&1 | grep -v -i warn | tail -3
echo "t=$(( $(date +%s)-t0 ))"
echo "== bench delta"; timeout -k 5 -s INT 230 python /tmp/L.py bench kda gated_deltanet --vs fla --no-decode --out $OUT/bench_delta 2>&1 | grep -v Warn | tail -34
echo "t=$(( $(date +%s)-t0 ))"
