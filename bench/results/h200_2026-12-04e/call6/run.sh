cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
pr() { timeout -k 5 -s INT $1 python bench/probe.py --specs $2 --T $3 --top 8 $4 --out $OUT/probe_$2_$3 2>&1 | grep '^{' | python -c "
import sys,json
for l in sys.stdin:
    d=json.loads(l); print(d.get('op'), d.get('config'), d.get('fwd_ms'), d.get('fwdbwd_ms')); print(' F', {k[:45]:v for k,v in (d.get('forward_kernels_us') or {}).items()})"; }
pr 100 linear_attn 16384 '--forward --configs 64,128,128,4,2,64,32,4;64,128,64,4,2,64,32,4;64,64,128,4,2,64,32,4;64,128,128,8,2,64,32,4;64,128,128,4,3,64,32,4'
pr 100 simple_gla 16384 '--forward --configs 64,128,128,4,3,64,64,8;64,128,64,4,3,64,64,8;64,64,128,4,3,64,64,8;64,128,128,8,3,64,64,8;64,128,128,4,2,64,64,8'
