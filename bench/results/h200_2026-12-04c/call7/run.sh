cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 190 python bench/probe.py --specs linear_attn --T 2048 --top 6 --configs "64,128,128,4,2,32,32,8;64,128,128,4,2,64,32,8;64,128,64,4,2,64,32,8;64,128,64,4,2,32,32,8;64,64,128,4,2,32,32,8;64,128,128,8,2,32,32,8;64,128,128,4,3,32,32,8;64,128,128,4,2,16,32,8" --out $OUT/probe_cfg 2>&1 | grep '^{' | python -c "
import sys,json
for l in sys.stdin:
    d=json.loads(l); print(d.get('config'), d.get('fwd_ms'), d.get('fwdbwd_ms'), {k[:50]:v for k,v in (d.get('kernels_us') or {}).items() if 'chunk_' in k})"
