nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
cd .kwt/src; export PYTHONPATH=$PWD TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src
echo "== probe lln (new: the contiguous stds one Welford reduction each)"; timeout -k 5 -s INT 90 python bench/probe.py --specs lln --T 4096 --forward --top 12 --out $OUT/probe_new 2>&1 | grep -v -i warn | tail -3
cd ../alt; export PYTHONPATH=$PWD TORCHINDUCTOR_CACHE_DIR=/tmp/ind_alt
echo "== probe lln (alt: every std two stages, each token's moments then one Welford over the pairs)"; timeout -k 5 -s INT 90 python bench/probe.py --specs lln --T 4096 --forward --top 12 --out $OUT/probe_alt 2>&1 | grep -v -i warn | tail -3
echo "== bench lln (alt)"; timeout -k 5 -s INT 100 python /tmp/L.py bench lln --vs sdpa --lengths 4096,8192 --no-decode --out $OUT/alt 2>&1 | grep -v Warn | tail -9
cd ../src; export PYTHONPATH=$PWD TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src
echo "== kloop none"; timeout -k 5 -s INT 110 python bench/kernel_variants.py --family additive --decay none --T 8192 --variants bench/results/h200_2026-12-05/call2/variants_output_kloop.json --out $OUT/kloop_none 2>&1 | grep -v -i warn | tail -10
echo "== kloop scalar"; timeout -k 5 -s INT 110 python bench/kernel_variants.py --family additive --decay scalar --T 8192 --variants bench/results/h200_2026-12-05/call2/variants_output_kloop_scalar.json --out $OUT/kloop_scalar 2>&1 | grep -v -i warn | tail -10
