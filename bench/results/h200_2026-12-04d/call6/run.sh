cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
pr() { timeout -k 5 -s INT $1 python bench/probe.py --specs $2 --T $3 --top 8 $4 --out $OUT/probe_$2_$3 2>&1 | grep '^{' | python -c "
import sys,json
for l in sys.stdin:
    d=json.loads(l); print(d.get('op'), d.get('config'), d.get('fwd_ms'), d.get('fwdbwd_ms'), {k[:45]:v for k,v in (d.get('kernels_us') or {}).items() if 'chunk' in k})"; }
pr 75 lln 8192 '--configs 64,128,128,4,2,32,32,4;64,128,128,4,2,64,32,4'
pr 60 lln 4096 '--configs 64,128,128,4,2,32,32,4;64,128,128,4,2,64,32,4'
pr 50 linear_attn 4096 '--configs 64,128,128,4,2,32,32,4;64,128,128,4,2,64,32,4'
