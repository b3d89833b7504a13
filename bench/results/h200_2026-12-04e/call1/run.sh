# output kernel: row scales after the dots (src) against main (old), forward per kernel; then simple_gla vs FLA everywhere
pr() { (cd .kwt/$1 && TORCHINDUCTOR_CACHE_DIR=/tmp/ind_$1 PYTHONPATH=$PWD timeout -k 5 -s INT $2 python bench/probe.py --specs $3 --T $4 --top 8 $5 --out $OUT/probe_$1_$4 2>&1 | grep '^{' | python -c "
import sys,json
for l in sys.stdin:
    d=json.loads(l); print('$1', d.get('op'), d.get('config'), d.get('fwd_ms'), d.get('fwdbwd_ms')); print(' F', {k[:45]:v for k,v in (d.get('forward_kernels_us') or {}).items()})"); }
pr src 100 simple_gla,retnet,linear_attn 2048 '--forward'
pr old 100 simple_gla,retnet,linear_attn 2048 '--forward'
cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 120 python /tmp/L.py bench simple_gla --vs fla --lengths 2048,4096,8192,16384 --no-decode --out $OUT/simple_gla 2>&1 | grep -A14 "┃ op"
