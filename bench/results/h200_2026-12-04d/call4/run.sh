[ -f /tmp/tcache/.fla2 ] || { tar xzf .kwt/fla2.tgz -C /tmp/tcache; touch /tmp/tcache/.fla2; }
cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
printf '%s\n' 'import sys' 'from lamixer.tools.cli import main' "sys.argv[0]='lamixer'" 'main()' > /tmp/L.py
timeout -k 5 -s INT 60 python /tmp/L.py bench lln --vs sdpa --lengths 4096,8192 --no-decode --out $OUT/lln 2>&1 | grep -A8 "┃ op"
for s in linear_attn retnet simple_gla; do timeout -k 5 -s INT 110 python /tmp/L.py bench $s --vs fla --lengths 2048,4096,8192,16384 --no-decode --out $OUT/$s 2>&1 | grep -A14 "┃ op"; done
(cd /tmp/tcache && find . -name "*.autotune.json" | tar czf $OUT/fla_autotune_all.tgz -T -); ls -la $OUT
