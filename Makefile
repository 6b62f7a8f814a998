# tilewise: the two commands of README.md.
#   make demo   install what is missing, build, run workflows/sample.yaml
#   make test   install what is missing, build, run the whole test suite
#               (release build with -Werror, then again under ASan+UBSan)
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
CMAKE_FLAGS ?=

.PHONY: all setup build demo test test-release test-asan test-tsan fuzz clean format-check layer-check function-check

all: build

setup:
	@bash scripts/setup.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DTILEWISE_WERROR=ON $(CMAKE_FLAGS)

build: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	@bash scripts/demo.sh $(BUILD)/tilewise

test: build
	$(MAKE) format-check
	$(MAKE) layer-check
	$(MAKE) function-check
	$(MAKE) test-release
	$(MAKE) test-asan
	$(MAKE) fuzz FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_JOBS=3

test-release:
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

$(ASAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTILEWISE_WERROR=ON \
	  -DTILEWISE_SANITIZE=ON -DTILEWISE_CUDA=OFF $(CMAKE_FLAGS)

test-asan: setup $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && TW_SANITIZED=1 ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS) -LE slow

# ThreadSanitizer (not part of `make test`: CI's time): the stage threads,
# their queues and the stops at spread-out moments (issue 39). Only the
# tilewise binary and those tests are built. tests/tsan.supp: reports inside
# libraries TSan cannot see into (libgomp's barriers, GDAL's lock order).
TSAN_FLAGS = -fsanitize=thread
$(TSAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTILEWISE_WERROR=ON \
	  -DTILEWISE_CUDA=OFF -DCMAKE_C_FLAGS="$(TSAN_FLAGS)" \
	  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread \
	  $(CMAKE_FLAGS)

test-tsan: setup $(TSAN_BUILD)/CMakeCache.txt
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target tilewise test_stages test_queue
	cd $(TSAN_BUILD) && TW_SANITIZED=1 \
	  TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp halt_on_error=0 exitcode=66" \
	  ctest --output-on-failure -R '^(fixtures_setup|test_stages|test_queue|e2e_stop_stress)$$'

# libFuzzer harnesses built with clang into build-fuzz/, each run FUZZ_SECONDS
# (fuzz/README.md); `make test` runs them for 45 s each, three at a time
# (six harnesses in two rounds: CI's 20 minutes; a clean clone's make test
# took 19:10 with 60 s on 2026-11-27), so on 2 cores each gets two thirds
# of one; `make fuzz` alone runs JOBS at a time.
FUZZ_SECONDS ?= 45
FUZZ_JOBS ?= $(JOBS)
fuzz: setup
	FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) FUZZ_JOBS=$(FUZZ_JOBS) bash fuzz/run.sh

# STYLE.md rule 15: every C source and header as .clang-format lays it out.
format-check: setup
	@files=$$(git ls-files '*.c' '*.h' 2>/dev/null || find . -name '*.[ch]' -not -path './build*'); \
	bad=$$(for f in $$files; do clang-format --dry-run --Werror "$$f" >/dev/null 2>&1 || echo "$$f"; done); \
	if [ -n "$$bad" ]; then echo "not clang-formatted (run: clang-format -i FILE):"; echo "$$bad"; exit 1; fi; \
	echo "format-check: $$(echo $$files | wc -w) files clang-formatted"

# DESIGN.md's layering: core/ <- io/, model/ (cuda/) <- pipeline/ <- config/ <- api/
# <- workflows/ (the CLI).
layer-check:
	@bash scripts/check_layers.sh

# Issue 35: no library function over 100 lines (split by step); the script
# holds the allowlist of those still being split.
function-check:
	@bash scripts/check_functions.sh

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) out
