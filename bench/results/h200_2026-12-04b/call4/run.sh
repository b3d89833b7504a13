cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
printf '%s\n' 'import sys' 'from lamixer.tools.cli import main' "sys.argv[0]='lamixer'" 'main()' > /tmp/L.py
timeout -k 5 -s INT 160 python bench/gpu.py --skip-time --skip-recurrent --skip-decode --quick --specs gated_deltanet,kda --out $OUT/check 2>&1 | grep "'check'\|checks:\|Error"
timeout -k 5 -s INT 30 python bench/kernel_variants.py --out $OUT/gdn 2>&1 | grep '^{'
timeout -k 5 -s INT 40 python bench/kernel_variants.py --decay key --out $OUT/kda 2>&1 | grep '^{'
timeout -k 5 -s INT 200 python /tmp/L.py bench gated_deltanet kda --vs fla --lengths 8192 --no-decode --out $OUT/bench 2>&1 | grep -A20 "┃ op"
