set -u
R=$OUT/study; mkdir -p $R
[ -x .gpu-carry/moet ] || tar xJf .gpu-pack/moet.tar.xz
python3 - data/corpus-study/test.jsonl.xz /tmp/heldout.txt <<'PY'
import json, lzma, sys
docs = [json.loads(line)["text"] for line in lzma.open(sys.argv[1], "rt")]
open(sys.argv[2], "w").write("\n\n".join(docs)[:12000])
PY
timeout 250 python3 tools/train/train.py --size study --seed 1234 --corpus data/corpus-study --cache /tmp/tok --out /tmp/study --time-limit 170 --eval-every 100 --eval-windows 64 > $R/train.log 2>&1
cp /tmp/study/metrics.json /tmp/study/config.json $R/ 2>/dev/null
MOET_ST_LIMIT=80 timeout 200 bash tools/gpu/study_tiered.sh $R/tiered /tmp/study /tmp/heldout.txt > $R/tiered.log 2>&1
MOET_SS_LIMIT=50 timeout 110 bash tools/gpu/study_speculative.sh $R/spec /tmp/study > $R/spec.log 2>&1
cd $OUT && tar czf study.tgz study && rm -rf study
