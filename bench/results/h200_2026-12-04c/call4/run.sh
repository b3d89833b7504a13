cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
printf '%s\n' 'import sys' 'from lamixer.tools.cli import main' "sys.argv[0]='lamixer'" 'main()' > /tmp/L.py
timeout -k 5 -s INT 60 python bench/kernel_variants.py --decay key --variants bench/results/h200_2026-12-04b/variants_knorm_kda.json --out $OUT/kda 2>&1 | grep '^{' | head -1
timeout -k 5 -s INT 330 python /tmp/L.py bench gated_deltanet deltanet kda --vs fla --lengths 2048,4096,8192,16384 --no-decode --out $OUT/bench 2>&1 | grep -A60 "┃ op"
