# Session driver (not committed): issue 27 pool sweep.
set -u
R=$OUT/sweep; mkdir -p $R
tar xJf .gpu-pack/carry.tar.xz
nvidia-smi > $R/nvidia-smi.txt; cat .gpu-carry/commit > $R/commit.txt
df -h /dev/shm /tmp > $R/df.txt; free -g >> $R/df.txt
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
L=${L:-48}; [ "$mem" -gt 100000 ] && L=94
n=$((L*128))
SL="$((n/10)) $((n/4)) $((n/2)) $n"
RT="uniform zipf:1.0"; [ $L = 94 ] && RT=${RT94:-uniform}
echo "layers $L slots $SL routings $RT" | tee $R/plan.txt
ROUTINGS="$RT" MODEL=Qwen3-235B-A22B:$L SLOTS="$SL" MOET_RB_LIMIT=${LIM:-110} timeout -k 5 ${TOTAL:-530} bash tools/gpu/residency_bench.sh $R
cd $OUT && tar czf sweep.tgz sweep && rm -rf sweep
