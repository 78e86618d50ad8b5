set -u
R=$OUT/r169; mkdir -p $R
echo "40b1835 (old bundle) against 40b1835 + BfcChunkHandleTable (new bundle, uncommitted)" > $R/commit.txt
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devrun/tfb/old.tar.xz && tar -C /tmp/b -xJf .devrun/tfb/new.tar.xz
mv /tmp/b/tf /tmp/b/old && mv /tmp/b/tf-new /tmp/b/new
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader > $R/gpu.txt
# same machine, alternating: the bandwidth test at a 16 GiB budget (64 MiB pages)
for rep in 1 2; do for v in old new; do
  LD_LIBRARY_PATH=/tmp/b/$v LMS_TEST_DEVICE_MB=16384 timeout 200 /tmp/b/$v/tf_lms_allocator_test \
    --gtest_filter='HostPagesMadeAhead/LmsBandwidth.*' > $R/bw16g_${v}_$rep.log 2>&1; echo "bw $v $rep rc=$?"
  grep -h "new region\|round 0\|round 1" $R/bw16g_${v}_$rep.log | sed 's/.*\] //' | cut -c1-260
done; done
# the whole GPU suite (program, memcheck, racecheck) on the new bundle
TF_LMS_ALLOCATOR_BUNDLE=/tmp/b/new timeout 400 python3 -m pytest -m gpu -p no:cacheprovider --confcutdir=tests/conformance \
  tests/conformance/tensorflow_allocator -q -s -rs > $R/tf_suite.log 2>&1; echo "suite rc=$?"
tail -4 $R/tf_suite.log; grep -h "BfcChunkHandleTable\|tests ran\|PASSED\|FAILED" $R/tf_suite.log | head -8
tar -C $OUT -czf $OUT/r169.tgz r169
