# SPDX-License-Identifier: Apache-2.0
# The README's two commands.  Each installs what is missing, configures, builds, then runs or tests.
#   make run    provider-sim + orderd on SQLite (./var/), a demo user and order; Ctrl-C stops both
#   make test   every test (SQLite and a throw-away PostgreSQL), then again under ASan+UBSan + fuzzers,
#               then the engine and the stores' contract suites under ThreadSanitizer
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
CTEST_FLAGS ?= --output-on-failure -j $(JOBS)

.PHONY: all deps deps-test build run run-gateway test test-fast test-asan test-tsan fuzz bench clean

all: build

# What building and running need (make build, make run, make run-gateway), and on top of it what
# the tests need (a PostgreSQL server, Patroni, clang's sanitizers, lintian, ...): scripts/deps.sh.
deps:
	@scripts/deps.sh

deps-test:
	@scripts/deps.sh test

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

run: build
	@scripts/run.sh

# idem-gateway in front of a small payments API that is not idempotent (docs/gateway.md).
run-gateway: build
	@scripts/run_gateway.sh

# The plain build's suite, then the whole suite again under ASan+UBSan (clang) with the fuzzers.
test: deps-test build
	@cd $(BUILD) && ctest $(CTEST_FLAGS) $(if $(PLAIN_SKIP),-E '$(PLAIN_SKIP)')
	@$(MAKE) --no-print-directory test-asan
	@$(MAKE) --no-print-directory test-tsan

test-fast: deps-test build
	@cd $(BUILD) && ctest $(CTEST_FLAGS) $(if $(PLAIN_SKIP),-E '$(PLAIN_SKIP)')

# The suites whose store is incidental: they test the HTTP layer, the gateway's framing, its TLS
# upstreams and its clients, orderd's config file and its TLS to the provider, a load balancer in
# front; the store only keeps and answers.  Their PostgreSQL twins (service-pg.<name>) run in
# neither make test run, their SQLite runs in both; the PostgreSQL store itself is
# contract.postgresql's and pg.*'s, under orderd and the gateway the twins of the suites where the
# store matters (docs/testing.md).
PG_INCIDENTAL = http_limits|gateway_streams|gateway_clients|gateway_failopen|gateway_tls|gateway_upstream_conns|haproxy_chaos|config_file|provider_tls
# The plain run also leaves out service-pg.chaos: there ha.chaos_failover runs idem-check chaos on
# PostgreSQL (three orderd, kill -9, every fault, webhooks, the audit) through two failovers, and
# the sanitized run keeps service-pg.chaos.  make test PLAIN_SKIP= runs everything.
PLAIN_SKIP ?= ^service-pg\.($(PG_INCIDENTAL)|chaos)$$
# Under ASan every suite runs but these, whose C code the sanitized run covers elsewhere: the
# Patroni failovers (their orderd paths are service-pg's), the twins of the incidental suites above,
# and those of gateway_limits, gateway_conventions and tokens (their checks of PostgreSQL's own run
# in the plain run).  make test-asan ASAN_SKIP= runs everything.
ASAN_SKIP ?= ^(ha\.|service-pg\.($(PG_INCIDENTAL)|gateway_limits|gateway_conventions|tokens)$$)
test-asan: deps-test
	@CC=clang cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DIDEM_SANITIZE=ON \
		-DIDEM_FUZZ=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS) -- --no-print-directory
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
		ctest $(CTEST_FLAGS) $(if $(ASAN_SKIP),-E '$(ASAN_SKIP)')

# Simulated power loss under the SQLite store, longer than make test's 16 cuts (docs/testing.md):
#   make power-loss POWER_ROUNDS=2000
POWER_ROUNDS ?= 400
.PHONY: power-loss
power-loss: deps-test build
	@$(BUILD)/bin/test_power_loss --rounds $(POWER_ROUNDS)

# Mutation testing of the durability proof (docs/testing.md, "Mutants"): each deliberate bug of
# tests/mutate/mutate.py applied to a scratch copy in $(BUILD)/mutate (which takes $(BUILD)'s
# object files), the crash and contract tests run on it; every mutant must be caught.  make test
# runs a fast subset (mutate.quick).
MUTATE_ROUNDS ?= 24
.PHONY: mutate
mutate: deps-test build
	@python3 tests/mutate/mutate.py --rounds $(MUTATE_ROUNDS) --work $(BUILD)/mutate \
		--objects-from $(BUILD)

# Flaky tests show here before a user meets them: the service suites (or any ctest regex in
# TESTS) N times in $(BUILD), then each test that failed in any run and how often.
#   make test-repeat N=3      make test-repeat N=5 BUILD=build-asan TESTS='gateway'
N ?= 3
TESTS ?= ^service(-pg)?\.
.PHONY: test-repeat
test-repeat: deps-test $(if $(filter $(BUILD),build),build)
	@scripts/test_repeat.sh $(BUILD) $(N) '$(TESTS)'

# The engine, its in-flight registry, the replay cache and both stores' contract suites (group
# commit, LISTEN/NOTIFY wake-ups, the async commit) under ThreadSanitizer: the parts where threads
# share state.  Then orderd, idem-gateway and provider-sim built with it, under the service suites
# that load their hand-offs between the event loops, the workers and the store's threads
# (src/http's limits and streams, the gateway's parked duplicates and replay cache, orderd's
# payments, webhooks and storms): a race reported in any of them ends that process
# (halt_on_error), and so its test.
TSAN_TESTS = store_contract test_store_pg test_engine test_inflight test_replay_cache \
	test_sqlite_commit orderd idem-gateway provider-sim idem-check
TSAN_SERVICE = storm|payments|webhook_inbox|replay_cache|http_limits|gateway|gateway_streams
test-tsan: deps-test
	@CC=clang cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DIDEM_TSAN=ON >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS) --target $(TSAN_TESTS) -- --no-print-directory
	@cd $(TSAN_BUILD) && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ctest $(CTEST_FLAGS) \
		-R '^(contract\.|pg\.store_pg$$|unit\.(engine|inflight|replay_cache|sqlite_commit)$$|service\.($(TSAN_SERVICE))$$)'

# Longer fuzzing by hand: make fuzz FUZZ_SECONDS=600
FUZZ_SECONDS ?= 300
fuzz: deps-test
	@CC=clang cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DIDEM_SANITIZE=ON \
		-DIDEM_FUZZ=ON -DIDEM_FUZZ_SECONDS=$(FUZZ_SECONDS) >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS) -- --no-print-directory
	@cd $(ASAN_BUILD) && ctest --output-on-failure -R '^fuzz\.'

# The benchmarks (docs/bench.md): an optimised build of its own, bounded load on 127.0.0.1
# against SQLite, a throw-away PostgreSQL cluster and nginx, a report + chart in bench/results/.
BENCH_BUILD ?= build-bench
BENCH_SECONDS ?= 5
# The benchmarks' throw-away PostgreSQL cluster loads pg_stat_statements (their reports' account
# of each PostgreSQL run; the tests' clusters do not).
BENCH_PG = IDEM_PG_SERVER_OPTS="-c shared_preload_libraries=pg_stat_statements" \
	sh tests/pg/with_pg.sh
BENCH_TARGETS = orderd commit_rate static_http storm idem-gateway \
	$(if $(wildcard src/provider-sim/CMakeLists.txt),provider-sim)
# The comparison with the Node peers (bench-peers below), run last by make bench too.
PEERS_BENCH = $(BENCH_PG) python3 bench/peers_bench.py --bin $(BENCH_BUILD)/bin --out bench/results \
	--seconds $(BENCH_SECONDS)
# The shards scaling benchmark (bench-shards below), run by make bench after the peers.
SHARDS_BENCH = python3 bench/shards_bench.py --bin $(BENCH_BUILD)/bin --out bench/results \
	--seconds $(BENCH_SECONDS)
bench:
	@scripts/deps.sh bench
	@cmake -S . -B $(BENCH_BUILD) -DCMAKE_BUILD_TYPE=Release -DIDEM_BENCH=ON \
		"-DCMAKE_C_FLAGS=-g -fno-omit-frame-pointer" >/dev/null
	@cmake --build $(BENCH_BUILD) -j $(JOBS) --target $(BENCH_TARGETS) -- --no-print-directory
	@$(BENCH_PG) python3 bench/bench.py --bin $(BENCH_BUILD)/bin --out bench/results \
		--seconds $(BENCH_SECONDS)
	@$(PEERS_BENCH)
	@$(SHARDS_BENCH)

# idem-gateway's benchmark (docs/bench.md, "idem-gateway"): the gateway against its
# upstream alone and against nginx proxy_pass, same build tree, about 2 minutes.
.PHONY: bench-gateway
bench-gateway:
	@scripts/deps.sh bench
	@cmake -S . -B $(BENCH_BUILD) -DCMAKE_BUILD_TYPE=Release -DIDEM_BENCH=ON \
		"-DCMAKE_C_FLAGS=-g -fno-omit-frame-pointer" >/dev/null
	@cmake --build $(BENCH_BUILD) -j $(JOBS) --target idem-gateway static_http handshakes \
		-- --no-print-directory
	@$(BENCH_PG) python3 bench/gateway_bench.py --bin $(BENCH_BUILD)/bin \
		--out bench/results --seconds $(BENCH_SECONDS)

# The comparison with Node peers (docs/bench.md, "Node peers"): orderd and idem-gateway on SQLite
# and on PostgreSQL (with_pg.sh's cluster) beside a Node server with the @node-idempotency
# middleware on Redis (no persistence, and appendfsync always) and the same server without
# idempotency, fresh keys and replays, wrk -t2 -c64, then the PostgreSQL rows again with a
# synchronous standby, in one run (about 6 minutes); make bench ends with it too.  Its report:
# bench/results/peers-<UTC time>.md.
# The npm packages go into bench/peers/node_modules (npm ci) when missing; Redis is Debian's.
#   make bench-peers BENCH_SECONDS=8     make bench-peers BENCH_BUILD=build-peers
.PHONY: bench-peers
bench-peers:
	@scripts/deps.sh bench
	@cmake -S . -B $(BENCH_BUILD) -DCMAKE_BUILD_TYPE=Release -DIDEM_BENCH=ON \
		"-DCMAKE_C_FLAGS=-g -fno-omit-frame-pointer" >/dev/null
	@cmake --build $(BENCH_BUILD) -j $(JOBS) --target orderd idem-gateway -- --no-print-directory
	@$(PEERS_BENCH)

# The shards scaling benchmark (docs/bench.md, "Shards: scaling with clusters"): idem-gateway on
# a shard set of 1, 2 and 4 PostgreSQL clusters of its own, each in a cgroup capped at the same
# CPU share (root: cgroup v1 or v2), fresh keys from 10,000 principals, then a model of 8..64
# clusters; about 3 minutes.  Its report: bench/results/shards-<UTC time>.md.
#   make bench-shards BENCH_SECONDS=8
.PHONY: bench-shards
bench-shards:
	@scripts/deps.sh bench
	@cmake -S . -B $(BENCH_BUILD) -DCMAKE_BUILD_TYPE=Release -DIDEM_BENCH=ON \
		"-DCMAKE_C_FLAGS=-g -fno-omit-frame-pointer" >/dev/null
	@cmake --build $(BENCH_BUILD) -j $(JOBS) --target idem-gateway static_http -- --no-print-directory
	@$(SHARDS_BENCH)

# idem-check chaos while the database fails over (docs/ha.md, "Chaos with failovers"): a Patroni
# cluster of three nodes (tests/ha/with_ha.sh), three orderd instances, one killed -9 every 3 s,
# every fault, and every 20 s a switchover or a killed primary (tests/ha/failover.sh); about
# 6 minutes on 2 cores.  The drive stops at CHAOS_FAILOVER_INTENTS or after 300 s (once the
# failover running then, if any, is over).
CHAOS_FAILOVER_INTENTS ?= 15000
.PHONY: chaos-failover
chaos-failover: deps-test build
	@sh tests/ha/with_ha.sh sh -c '$(BUILD)/bin/idem-check chaos \
		--orderd-bin $(BUILD)/bin/orderd --provider-bin $(BUILD)/bin/provider-sim \
		--db "$$IDEM_TEST_HA_URI" --instances 3 --kill-every 3 \
		--failover-every 20 --failover-cmd "sh tests/ha/failover.sh" \
		--intents $(CHAOS_FAILOVER_INTENTS) --clients 8 --max-time 300 --grace 120 \
		--drop-rate 0.1 --reset-rate 0.05 --cut-rate 0.05 --dup-rate 0.1 \
		--provider-lost-rate 0.05 --provider-5xx-rate 0.05 --webhook-dup 2'

# The same over a shard set (docs/chaos.md, "Over a shard set"): orderd on three clusters, two
# plain servers and the Patroni cluster, 60 users; phase 1 has every fault of chaos-failover, the
# Patroni cluster failing over every 20 s and a bucket moving between the plain ones every 15 s,
# for CHAOS_SHARDS_MAX_TIME s (at least one failover and two moves); phase 2 only kills the
# Patroni cluster's primary and checks that the other clusters' users saw no error.  Both audits
# must be clean.  About 5 minutes on 2 cores.  The bucket that moves is the one with the most of
# the run's users, its records and orderd's rows carried along; CHAOS_SHARDS_MOVE=empty moves
# instead one that none of them has.
CHAOS_SHARDS_MAX_TIME ?= 90
CHAOS_SHARDS_MOVE ?= users
.PHONY: chaos-shards
chaos-shards: deps-test build
	@CHAOS_SHARDS_MAX_TIME=$(CHAOS_SHARDS_MAX_TIME) CHAOS_SHARDS_MOVE=$(CHAOS_SHARDS_MOVE) \
		sh tests/ha/chaos_shards.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(BENCH_BUILD)

# Debian packages (docs/ops.md, "Packages"): CPack makes libidem0, libidem-client0, libidem-dev,
# idem-tools, orderd and idem-gateway from $(BUILD) into $(BUILD)/*.deb; lintian must find no
# error in them.  Then: dpkg -i $(BUILD)/*.deb
.PHONY: deb
deb: build
	@cd $(BUILD) && cpack -G DEB
	@lintian --fail-on error $(BUILD)/*.deb
