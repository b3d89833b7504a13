cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
printf '%s\n' 'import sys' 'from lamixer.tools.cli import main' "sys.argv[0]='lamixer'" 'main()' > /tmp/L.py
timeout -k 5 -s INT 150 python bench/gpu.py --skip-time --skip-recurrent --skip-decode --quick --specs kda,gated_deltanet --out $OUT/check 2>&1 | grep "'check'\|checks:"
timeout -k 5 -s INT 60 python bench/kernel_variants.py --variants bench/results/h200_2026-12-04/variants_next.json --out $OUT/x 2>&1 | grep '^{'
timeout -k 5 -s INT 200 python /tmp/L.py bench kda gated_deltanet --vs fla --lengths 8192 --no-decode --out $OUT/bench 2>&1 | grep -A20 "┃ op"
