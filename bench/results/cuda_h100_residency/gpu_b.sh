set -u
R=$OUT/card; mkdir -p $R
[ -x .gpu-carry/moet ] || tar xJf .gpu-pack/carry.tar.xz
df -h /dev/shm /tmp > $R/df.txt
timeout 150 bash tools/gpu/wave2_tests.sh $R/tests 60 > $R/tests.log 2>&1
P=/dev/shm/p; avail=$(df --output=avail -B1 /dev/shm | tail -1); [ "$avail" -lt 70000000000 ] && P=/tmp/p
echo "pack dir $P" >> $R/df.txt
RESIDENT=0 SLOTS=0 ROUTINGS=zipf:1.0 MOET_RB_LIMIT=150 EXTRA="--gpu-memory-limit 32 --expert-cache-gb auto" timeout 160 bash tools/gpu/residency_bench.sh $R/ram > /dev/null 2>&1
RESIDENT=0 SLOTS=0 ROUTINGS=zipf:1.0 MOET_RB_LIMIT=200 EXTRA="--gpu-memory-limit 32 --expert-cache-gb auto --expert-store arena --pack-dir $P" timeout 210 bash tools/gpu/residency_bench.sh $R/arena > /dev/null 2>&1
ls -la $P >> $R/df.txt 2>&1
cd $OUT && tar czf card.tgz card && rm -rf card
