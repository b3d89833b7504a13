cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
printf '%s\n' 'import sys' 'from lamixer.tools.cli import main' "sys.argv[0]='lamixer'" 'main()' > /tmp/L.py
timeout -k 5 -s INT 110 python bench/probe.py --specs kda --T 8192 --top 14 --fla --forward --out $OUT/probe 2>&1 | tail -60
timeout -k 5 -s INT 200 python /tmp/L.py bench gated_deltanet deltanet --vs fla --lengths 2048,4096 --no-decode --out $OUT/bench 2>&1 | grep -A20 "┃ op"
