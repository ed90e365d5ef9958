#!/bin/bash
# usage: batch.sh "variant study sigma seeds..." ...  (runs sequentially, each with Pool(2))
for spec in "$@"; do
  OMP_NUM_THREADS=1 PYTHONPATH=/tmp/fid /work/main/.venv/bin/python /tmp/fid/exp/run_exp.py $spec
done
