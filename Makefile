# sharding: PGXS build of a C++17 PostgreSQL extension.
EXTENSION  = sharding
EXTVERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" sharding.control)

MODULE_big = sharding
OBJS = \
	src/boundary.o \
	src/cache.o \
	src/fanout.o \
	src/guard.o \
	src/module.o \
	src/hash.o \
	src/legacy.o \
	src/maps.o \
	src/observe.o \
	src/partitions.o \
	src/queue.o \
	src/queue_ordered.o \
	src/rank.o \
	src/rebalance.o \
	src/rebalance_load.o \
	src/route_cache.o

# The install script of the current version is assembled from one fragment
# per topic, in order. Older versions' install scripts are kept as released,
# with an upgrade script from each to the next.
INSTALL_PARTS = $(sort $(wildcard sql/install/*.sql))
DATA_built = sql/sharding--$(EXTVERSION).sql sql/sharding--1.1--1.2.sql
DATA = sql/sharding--1.0.sql sql/sharding--1.0--1.1.sql sql/sharding--1.1.sql

# The upgrade 1.1 -> 1.2 (not yet released, so still assembled): changes to
# objects 1.1 had (sql/upgrade/1.1--1.2/*.sql) and the install fragments of
# topics new in 1.2 (sql/install/8*.sql, 9*.sql), in order of file name.
UPGRADE_1_2_PARTS = $(wildcard sql/upgrade/1.1--1.2/*.sql sql/install/8*.sql sql/install/9*.sql)

# pg_regress tests: every sql/<name>.sql against expected/<name>.out.
REGRESS = $(sort $(filter-out sharding--%,$(basename $(notdir $(wildcard sql/*.sql)))))

# Isolation tests (pg_isolation_regress, from PGXS): every specs/<name>.spec
# against expected/<name>.out; make installcheck runs them after REGRESS.
ISOLATION = $(sort $(basename $(notdir $(wildcard specs/*.spec))))

PG_CONFIG ?= pg_config
PG_CPPFLAGS = -isystem $(shell $(PG_CONFIG) --includedir-server) -Isrc
# -fvisibility=hidden: sharding.so exports only what PostgreSQL looks up
# (SHARDING_EXPORT in src/boundary.hpp; test/harness/symbols.sh checks).
PG_CXXFLAGS = -std=c++17 -Wall -Wextra -Werror -Wno-missing-field-initializers -fvisibility=hidden -fvisibility-inlines-hidden
SHLIB_LINK += -lstdc++ -Wl,--version-script=$(CURDIR)/src/exports.map
# For PG_MODULE_MAGIC_EXT (PostgreSQL 18), see src/compat.hpp.
PG_CPPFLAGS += -DSHARDING_VERSION='"$(EXTVERSION)"'

# XXH3: inlined from xxhash.h by default (measured faster, see README);
# `make XXHASH=link` links Debian's libxxhash instead.
ifeq ($(XXHASH),link)
PG_CPPFLAGS += -DSHARDING_XXH_LINKED
SHLIB_LINK += -lxxhash
endif

# Sanitizer build (see README, "Sanitizers"): make SANITIZE=undefined, or
# SANITIZE=address,undefined where the ASan runtime can be preloaded.
ifneq ($(SANITIZE),)
PG_CXXFLAGS += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
SHLIB_LINK += -fsanitize=$(SANITIZE)
endif

# No LLVM bitcode: JIT inlining of these functions is not worth requiring
# clang on every build machine.
override with_llvm = no

EXTRA_CLEAN = results regression.diffs regression.out .build-flags

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# Objects are rebuilt whenever the build variant (SANITIZE, XXHASH) changes,
# so a sanitizer build can never be linked half-instrumented.
# (Written while parsing: PGXS declares .SECONDARY, so make would never
# remake a missing stamp.)
BUILD_FLAGS := sanitize=$(SANITIZE) xxhash=$(XXHASH)
ifneq ($(BUILD_FLAGS),$(shell cat .build-flags 2>/dev/null))
$(shell echo '$(BUILD_FLAGS)' > .build-flags)
endif
$(OBJS): .build-flags $(wildcard src/*.hpp)
$(shlib): src/exports.map

sql/sharding--$(EXTVERSION).sql: $(INSTALL_PARTS) sharding.control
	cat $(INSTALL_PARTS) > $@

sql/sharding--1.1--1.2.sql: $(UPGRADE_1_2_PARTS)
	for f in $(UPGRADE_1_2_PARTS); do echo "$$(basename $$f) $$f"; done | sort | cut -d' ' -f2 | xargs cat > $@

# The pure core: files that include no PostgreSQL header, only the standard
# library and each other, so they can be unit-tested (test/unit) and reasoned
# about without longjmp. check-layers compiles each one with no PostgreSQL
# include path (test/harness/layers.sh runs it).
PURE = src/cache_alloc.hpp src/hash_core.hpp src/observe_core.hpp src/partition_hash.hpp \
	src/rank_core.hpp src/rebalance.hpp src/rebalance.cpp src/route_cache.hpp src/route_cache.cpp

check-layers:
	@for f in $(PURE); do \
		if echo '' | $(CXX) -std=c++17 -fsyntax-only -Wall -Wextra -Werror -Isrc -x c++ -include $$f - 2>/dev/null; \
		then echo "ok - $$f compiles without PostgreSQL headers"; \
		else echo "not ok - $$f needs PostgreSQL headers (it belongs in the glue, not the pure core)"; fi; \
	done

.PHONY: test demo sanitize memcheck check-layers
# make test never installs packages: it reports what is missing instead
# (bash test/run.sh, run as root by hand, may apt-get them).
test:
	SHARDING_NO_APT=1 bash test/run.sh
sanitize:
	bash test/sanitize.sh
memcheck:
	bash test/memcheck.sh
demo:
	bash demo/run.sh
