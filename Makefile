# sharding: PGXS build of a C++17 PostgreSQL extension.
EXTENSION  = sharding
EXTVERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" sharding.control)

MODULE_big = sharding
# src/ is laid out by layer and topic (docs/architecture.md): core/ is pure
# C++ (no PostgreSQL header), pg/ the glue every topic shares (error
# boundary, caches, key types), then one folder per topic.
SRCS = $(sort $(wildcard src/*/*.cpp))
OBJS = $(SRCS:.cpp=.o)

# The install script of the current version is assembled from one fragment
# per topic (sql/install/), in order. Released versions' install and upgrade
# scripts are frozen as they shipped (sql/sharding--<v>.sql,
# sql/sharding--<a>--<b>.sql); the upgrade to the current version is
# assembled from the hand-written deltas in sql/upgrade/<from>--<to>/,
# which test/harness/upgrade.sh checks against a fresh install.
INSTALL_PARTS = $(sort $(wildcard sql/install/*.sql))
# Topics new in this version have no delta: their install fragment itself
# ends the upgrade (one text, not a copy that could drift).
NEW_TOPICS =
PREV_VERSION = 1.3
UPGRADE_PARTS = $(sort $(wildcard sql/upgrade/$(PREV_VERSION)--$(EXTVERSION)/*.sql)) $(NEW_TOPICS)
DATA_built = sql/sharding--$(EXTVERSION).sql sql/sharding--$(PREV_VERSION)--$(EXTVERSION).sql
DATA = sql/sharding--1.0.sql sql/sharding--1.0--1.1.sql sql/sharding--1.1.sql \
	sql/sharding--1.1--1.2.sql sql/sharding--1.2.sql sql/sharding--1.2--1.3.sql sql/sharding--1.3.sql

# pg_regress tests: every sql/<name>.sql against expected/<name>.out.
REGRESS = $(sort $(filter-out sharding--%,$(basename $(notdir $(wildcard sql/*.sql)))))

# Isolation tests (pg_isolation_regress, from PGXS): every specs/<name>.spec
# against expected/<name>.out; make installcheck runs them after REGRESS.
ISOLATION = $(sort $(basename $(notdir $(wildcard specs/*.spec))))

PG_CONFIG ?= pg_config
PG_CPPFLAGS = -isystem $(shell $(PG_CONFIG) --includedir-server) -Isrc
# -fvisibility=hidden: sharding.so exports only what PostgreSQL looks up
# (SHARDING_EXPORT in src/pg/boundary.hpp, and the version script
# src/pg/exports.map generated below; test/harness/layers.sh checks).
PG_CXXFLAGS = -std=c++17 -Wall -Wextra -Wno-missing-field-initializers -fvisibility=hidden -fvisibility-inlines-hidden
# Warnings are errors where the project builds itself (the test command and
# CI set WERROR=1), not for a packager's `make`, whose newer compiler may
# warn about things this one does not.
ifeq ($(WERROR),1)
PG_CXXFLAGS += -Werror
endif
SHLIB_LINK += -lstdc++ -Wl,--version-script=$(CURDIR)/src/pg/exports.map
# For PG_MODULE_MAGIC_EXT (PostgreSQL 18), see src/pg/compat.hpp.
PG_CPPFLAGS += -DSHARDING_VERSION='"$(EXTVERSION)"'
# libpq: the engine's one remote stack (src/remote/), linked
# as contrib dblink links it (PGXS's libpq variables; package libpq-dev).
PG_CPPFLAGS += -I$(libpq_srcdir)
SHLIB_LINK_INTERNAL = $(libpq)

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

EXTRA_CLEAN = results regression.diffs regression.out .build-flags src/pg/exports.map src/pg/legacy_symbols.inc

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# Objects are rebuilt whenever the build variant (SANITIZE, XXHASH) changes,
# so a sanitizer build can never be linked half-instrumented.
# (Written while parsing: PGXS declares .SECONDARY, so make would never
# remake a missing stamp.)
BUILD_FLAGS := sanitize=$(SANITIZE) xxhash=$(XXHASH) werror=$(WERROR)
ifneq ($(BUILD_FLAGS),$(shell cat .build-flags 2>/dev/null))
$(shell echo '$(BUILD_FLAGS)' > .build-flags)
endif
$(OBJS): .build-flags $(wildcard src/*/*.hpp)
$(shlib): src/pg/exports.map

# A delta takes an object's definition from its install fragment instead of
# a copy: `-- @object NAME` ... `-- @end` marks it there, `-- @include NAME`
# (as it is) or `-- @replace NAME` (CREATE made CREATE OR REPLACE) in the
# delta stands for it (sql/upgrade/include.awk, which also drops the markers
# from both scripts).
INCLUDE = sql/upgrade/include.awk

sql/sharding--$(EXTVERSION).sql: $(INSTALL_PARTS) sharding.control $(INCLUDE)
	awk -f $(INCLUDE) out=1 $(INSTALL_PARTS) > $@.tmp && mv $@.tmp $@

sql/sharding--$(PREV_VERSION)--$(EXTVERSION).sql: $(UPGRADE_PARTS) $(INSTALL_PARTS) sharding.control Makefile $(INCLUDE)
	awk -f $(INCLUDE) $(INSTALL_PARTS) out=1 $(UPGRADE_PARTS) > $@.tmp && mv $@.tmp $@

# The C symbols sharding.so exports come from one source, the SQL scripts
# that can be installed: every symbol their C functions name (AS
# 'MODULE_PATHNAME', '<symbol>'), with its pg_finfo_ record, plus the entry
# points PostgreSQL looks up by name (EXPORTS_EXTRA): the magic block,
# _PG_init, and background workers' functions (bgw_function_name), which
# must be named sharding_<what>_main (add an output plugin's init there if
# one comes). Everything else is local. The released
# scripts (DATA) are frozen: the names they link that are not sharding_*
# (from before every symbol was named sharding_<name>) become aliases of
# the sharding_ functions, generated into src/pg/legacy_symbols.inc for
# src/pg/legacy.cpp. The current script links sharding_* names only
# (test/harness/layers.sh checks both rules).
EXPORTS_EXTRA = Pg_magic_func _PG_init _PG_output_plugin_init sharding_*_main
script_symbols = grep -ho "'MODULE_PATHNAME', *'[A-Za-z0-9_]*'" $(1) | sed "s/.*, *'//;s/'$$//" | LC_ALL=C sort -u

src/pg/exports.map: $(DATA) sql/sharding--$(EXTVERSION).sql sql/sharding--$(PREV_VERSION)--$(EXTVERSION).sql Makefile
	{ echo '/* Generated by the Makefile from the installable SQL scripts: do not edit. */'; \
	  echo '{'; echo '  global:'; \
	  $(foreach s,$(EXPORTS_EXTRA),echo '    $(s);';) \
	  $(call script_symbols,$(filter %.sql,$^)) | sed 's/.*/    &;\n    pg_finfo_&;/'; \
	  echo '  local:'; echo '    *;'; echo '};'; } > $@.tmp && mv $@.tmp $@

src/pg/legacy_symbols.inc: $(DATA) Makefile
	{ echo '/* Generated by the Makefile from the released SQL scripts: do not edit. */'; \
	  $(call script_symbols,$(DATA)) | grep -v '^sharding_' | sed 's/.*/SHARDING_LEGACY_SYMBOL(&, sharding_&)/'; \
	} > $@.tmp && mv $@.tmp $@

src/pg/legacy.o: src/pg/legacy_symbols.inc

# For test/harness/layers.sh, which checks the exports against the same list.
print-exports-extra:
	@echo '$(EXPORTS_EXTRA)'

# The pure core, src/core/: files that include no PostgreSQL header, only
# the standard library and each other, so they can be unit-tested
# (test/unit) and reasoned about without longjmp. check-layers compiles each
# one with no PostgreSQL include path and fails if any of them needs one
# (test/harness/layers.sh runs it).
PURE = $(sort $(wildcard src/core/*.hpp src/core/*.cpp))

#
# The layers of src/, from the bottom up (docs/architecture.md, "Layers and
# topics of src/"); folders of one layer are joined by commas and may not
# use each other. A file includes, and calls, only its own folder and the
# layers below it: check-layers reads every #include "..." of src/ and,
# from the object files (build first: make), every call between folders,
# and fails on one that runs back up or on a cycle between folders. The
# roots are the module's entry points (_PG_init and the aliases of the
# frozen scripts' symbols) and may call every layer. It also fails on a
# folder named like a PostgreSQL header folder, a folder over a quarter of
# src/, a file over 1,500 lines and a function over 150 (KNOWN_LONG lists
# file:function exceptions, to be split; the list may only shrink).
# test/check_layers.py is the check; LAYER_SRC lets test/harness/layers.sh
# show that it fails on a copy of src/ with a bad include or call.
LAYERS = core pg remote routing queue,rank,observe,ddl datanode move jobs
LAYER_ROOTS = pg/module.cpp pg/legacy.cpp
LAYER_SRC = src
KNOWN_LONG =

check-layers:
	@rc=0; for f in $(PURE); do \
		if echo '' | $(CXX) -std=c++17 -fsyntax-only -Wall -Wextra -Werror -Isrc -x c++ -include $$f - 2>/dev/null; \
		then echo "ok - $$f compiles without PostgreSQL headers"; \
		else echo "not ok - $$f needs PostgreSQL headers (it belongs in the glue, not the pure core)"; rc=1; fi; \
	done; \
	python3 test/check_layers.py --src '$(LAYER_SRC)' --layers '$(LAYERS)' --roots '$(LAYER_ROOTS)' --objects \
		--pg-includedir '$(shell $(PG_CONFIG) --includedir-server)' --known-long '$(KNOWN_LONG)' || rc=1; \
	exit $$rc

.PHONY: test demo sanitize memcheck check-layers print-exports-extra
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
