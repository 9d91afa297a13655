# Nested lab and guest artifacts (issue 3). See README "Nested lab".
#   make guest        L2 artifacts in build/guest/ (Debian kernel, vmlinux, initrd)
#   make lab          boot the lab once and run LAB_SCRIPT (default: the QEMU L2 proof)
#   make test-lab     every lab/tests/*.sh in its own lab run
#   make bench-lab    boot-density benchmark: densevm vs QEMU (BENCH_VMMS, BENCH_COUNTS, BENCH_KSM)
LAB_DENSEVM ?= $(abspath $(or $(CARGO_TARGET_DIR),target))/release/densevm
LAB_SCRIPT ?= lab/tests/qemu-l2-boot.sh
LAB_TESTS ?= $(sort $(wildcard lab/tests/*.sh))

.PHONY: guest lab test-lab bench-lab test-kernel-real

guest: build
	DENSEVM=$(LAB_DENSEVM) lab/guest/build.sh

lab: guest
	DENSEVM=$(LAB_DENSEVM) lab/run $(LAB_SCRIPT)

test-lab: guest test-kernel-real
	@failed=""; for t in $(LAB_TESTS); do \
	  echo "== lab test $$t"; \
	  DENSEVM=$(LAB_DENSEVM) lab/run $$t || failed="$$failed $$t"; \
	done; \
	if [ -n "$$failed" ]; then echo "lab tests FAILED:$$failed"; exit 1; fi; \
	echo "lab tests passed: $(words $(LAB_TESTS))"

# Checks densevm-kernel against the real Debian bzImage and vmlinux.
test-kernel-real: guest
	lab/guest/check-kernel.sh $(LAB_DENSEVM)

# Results also land in build/lab/boot-density.txt.
bench-lab: guest
	@mkdir -p build/lab
	DENSEVM=$(LAB_DENSEVM) LAB_TIMEOUT=$${LAB_TIMEOUT:-2400} lab/run lab/bench/boot-density.sh > build/lab/boot-density.txt; \
	  status=$$?; cat build/lab/boot-density.txt; exit $$status

TEST_TARGETS += test-lab
BENCH_TARGETS += bench-lab
