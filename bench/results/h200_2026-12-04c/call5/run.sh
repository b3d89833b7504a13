cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
printf '%s\n' 'import sys' 'from lamixer.tools.cli import main' "sys.argv[0]='lamixer'" 'main()' > /tmp/L.py
timeout -k 5 -s INT 120 python bench/probe.py --specs lln --T 8192 --top 8 --configs "64,128,128,4,2,32,32,8;128,128,128,8,2,32,32,8;128,128,128,8,2,32,16,8" --out $OUT/probe_lln 2>&1 | grep '^{' | cut -c1-600
timeout -k 5 -s INT 330 python /tmp/L.py bench linear_attn retnet simple_gla --vs fla --lengths 2048,4096,8192,16384 --no-decode --out $OUT/bench 2>&1 | grep -A70 "┃ op"
cd /tmp/tcache && find . -name "*.autotune.json" | tar czf $OUT/fla_autotune_additive.tgz -T -
