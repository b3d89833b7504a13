K=$PWD/.kwt
b() { (cd $K/$1; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_$1 PYTHONPATH=$PWD BT=$2; echo "== $1 BT=$2"; timeout -k 5 -s INT $3 python $K/LB.py bench lln --vs sdpa --lengths 4096,8192 --no-decode --out $OUT/lln_$1_$2 2>&1 | grep -A12 "┃ op"); }
b fm 0 150
b src 0 110
b fm 128 110
