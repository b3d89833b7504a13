K=$PWD/.kwt
pr() { (cd $K/$1; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_$1 PYTHONPATH=$PWD; echo "== $1 $2 $3"; timeout -k 5 -s INT $4 python bench/probe.py --specs $2 --T $3 --top 12 --forward --out $OUT/probe_$1_$2_$3 2>&1 | grep '^{' | python -c "
import sys,json
for l in sys.stdin:
    d=json.loads(l); print(d.get('op'), d.get('config'), d.get('fwd_ms'), d.get('fwdbwd_ms')); print(' F', {k[:45]:v for k,v in (d.get('forward_kernels_us') or {}).items()}); print(' B', {k[:45]:v for k,v in (d.get('kernels_us') or {}).items()})"); }
pr src lln 4096 70
pr fm lln 4096 70
for s in simple_gla linear_attn retnet; do pr src $s 2048 45; pr gr $s 2048 45; done
