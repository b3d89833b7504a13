nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
export PYTHONPATH=$PWD TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src
t0=$(date +%s)
echo "== check"; timeout -k 5 -s INT 150 python /tmp/L.py check linear_attn simple_gla retnet lln examples/specs/gla_normalized.lam --device cuda 2>&1 | grep -v Warn | tail -4
echo "t=$(( $(date +%s)-t0 ))"
echo "== bench dense vs FLA"; timeout -k 5 -s INT 220 python /tmp/L.py bench linear_attn simple_gla retnet --vs fla --no-decode --out $OUT/bench_dense 2>&1 | grep -v Warn | tail -30
echo "t=$(( $(date +%s)-t0 ))"
echo "== bench lln vs SDPA"; timeout -k 5 -s INT 150 python /tmp/L.py bench lln --vs sdpa --no-decode --out $OUT/bench_lln 2>&1 | grep -v Warn | tail -12
echo "t=$(( $(date +%s)-t0 ))"
