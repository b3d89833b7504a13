cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 330 python bench/defaults_vs_tuned.py --specs linear_attn retnet --lengths 2048,8192 --configs 64,128,128,4,2,32,32,4 64,128,128,4,2,64,32,4 64,128,128,4,3,64,32,8 64,128,128,4,2,32,64,8 64,128,128,4,2,64,64,8 64,128,128,4,3,64,64,8 64,128,128,4,3,32,32,8 --out $OUT/dvt/defaults_vs_tuned.json 2>&1 | tail -12
python -c "
import json; d=json.load(open('$OUT/dvt/defaults_vs_tuned.json'))
for r in d['rows']: print(r['spec'], r['T'], 'default', r.get('default'), r.get('default_fwd_ms'), r.get('default_fwdbwd_ms')); [print('   ', k, v) for k, v in r.get('candidates_ms', {}).items()]"
