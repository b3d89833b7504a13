cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
printf '%s\n' 'import sys' 'from lamixer.tools.cli import main' "sys.argv[0]='lamixer'" 'main()' > /tmp/L.py
timeout -k 5 -s INT 280 python /tmp/L.py bench kda gated_deltanet --vs fla --lengths 2048,4096 --no-decode --out $OUT/bench_short 2>&1 | grep -A30 "┃ op"
