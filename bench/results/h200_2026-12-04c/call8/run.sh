cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
p() { timeout -k 5 -s INT $1 python bench/probe.py --specs $2 --T 2048 --top 6 --configs "$3" --out $OUT/probe_$2 2>&1 | grep '^{' | python -c "
import sys,json
for l in sys.stdin:
    d=json.loads(l); print(d.get('spec'), d.get('config'), d.get('fwd_ms'), d.get('fwdbwd_ms'), {k[:50]:v for k,v in (d.get('kernels_us') or {}).items() if 'chunk_' in k})"; }
p 50 linear_attn "64,128,128,4,3,64,32,8"
p 70 retnet "64,128,128,4,2,64,64,8;64,128,128,4,3,64,64,8"
p 70 simple_gla "64,128,128,4,2,64,64,8;64,128,128,4,3,64,64,8"
