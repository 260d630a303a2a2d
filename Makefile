# The two set-up commands (README): `make run` and `make test`. Each installs what it needs
# (scripts/install-deps.sh, idempotent), configures, builds with ccache, then runs.
BUILD ?= build
JOBS ?= $(shell nproc)
CONFIG ?= configs/math-tiny.yaml
# ccache keys on relative paths, so clones in other folders (CI) reuse the cache.
export CCACHE_BASEDIR := $(CURDIR)

.PHONY: all deps configure build test run bench fuzz clean gsm8k-style

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 900 -j $(JOBS)

# Only the binary it runs: the unit tests and test tools are `make build`'s and `make test`'s.
run: configure
	cmake --build $(BUILD) -j $(JOBS) --target echelon
	./$(BUILD)/echelon train $(CONFIG)

# Your own data end to end (configs/gsm8k-style.yaml): writes the tiny Qwen3 once, then trains.
GSM8K_MODEL := $(BUILD)/models/qwen3-tiny
gsm8k-style: configure
	cmake --build $(BUILD) -j $(JOBS) --target echelon
	[ -d $(GSM8K_MODEL) ] || bash scripts/tiny-qwen3.sh $(GSM8K_MODEL) $(BUILD)/echelon
	./$(BUILD)/echelon train configs/gsm8k-style.yaml --set model.init=$(GSM8K_MODEL)

bench: configure
	cmake --build $(BUILD) -j $(JOBS) --target generate_bench learner_step_bench simulate_bench \
	    broadcast_scale_bench broadcast_publish_bench
	./$(BUILD)/generate_bench
	./$(BUILD)/learner_step_bench
	./$(BUILD)/simulate_bench
	./$(BUILD)/broadcast_scale_bench
	./$(BUILD)/broadcast_publish_bench

fuzz:
	bash scripts/fuzz.sh

clean:
	rm -rf $(BUILD) build-fuzz
