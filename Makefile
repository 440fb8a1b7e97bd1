# cinfer build. `make` builds build/cinfer, build/libcinfer.a and .so;
# `make test` runs the suite in a release build and again under ASan+UBSan.
# Sources are picked up by wildcard: add a .c under src/ and it is built.
CC      ?= cc
BUILD   ?= build
SAN     ?= 0
CUDA    ?= auto
PKGS     = jansson libpcre2-8 libutf8proc libmicrohttpd
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

CFLAGS_BASE = -std=c11 -g -Wall -Wextra -Werror -D_GNU_SOURCE -Iinclude -Isrc -fPIC \
              -I/usr/include/x86_64-linux-gnu/openblas-pthread $(PKG_CFLAGS)
ifeq ($(SAN),1)
  OPT = -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
else
  OPT = -O2
endif
CFLAGS += $(CFLAGS_BASE) $(OPT)

# The library's version (semantic) and, in a git checkout, its revision.
VERSION  = 0.1.0
SOMAJOR  = 0
GIT_REV := $(shell git rev-parse --short=12 HEAD 2>/dev/null)
VFLAGS   = -DCINFER_VERSION='"$(VERSION)"' $(if $(GIT_REV),-DCINFER_GIT_REV='"$(GIT_REV)"')
PREFIX  ?= /usr/local
LIBDIR  ?= $(PREFIX)/lib
LDLIBS  = -lopenblas $(PKG_LIBS) -lxxhash -lpthread -lmvec -lm

SRC   := $(wildcard src/*/*.c src/*/*/*.c)
OBJ   := $(SRC:%.c=$(BUILD)/%.o)
CLI   := $(wildcard tools/cli/*.c)
CLIOBJ:= $(CLI:%.c=$(BUILD)/%.o)
TESTS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test-*.c))
BENCH := $(patsubst bench/%.c,$(BUILD)/bench/%,$(wildcard bench/*.c))

# CUDA: built when nvcc is found (CUDA=auto) or forced (CUDA=1); CUDA=0 skips it.
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifeq ($(CUDA),auto)
  CUDA := $(if $(NVCC),1,0)
endif
ifeq ($(SAN),1)
  CUDA := 0
endif
CU_SRC := $(wildcard src/backend/cuda/*.cu)
ifeq ($(CUDA),1)
ifneq ($(CU_SRC),)
  CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
  CU_OBJ := $(CU_SRC:%.cu=$(BUILD)/%.o)
  OBJ += $(CU_OBJ)
  CFLAGS += -DCINFER_CUDA=1
  LDLIBS += -L$(CUDA_HOME)/lib64 -lcudart -lcublas -lcublasLt -lstdc++ -Wl,-rpath,$(CUDA_HOME)/lib64
  NVFLAGS = -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Iinclude -Isrc -Xcompiler -fPIC --expt-relaxed-constexpr $(NVDEFS)
endif
endif

all: $(BUILD)/cinfer $(BUILD)/libcinfer.a $(BUILD)/libcinfer.so
tests: $(TESTS)
bench: $(BENCH)

$(BUILD)/%.o: %.c $(wildcard include/*.h src/*/*.h src/*/*/*.h tools/cli/*.h tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@
$(BUILD)/%.o: %.cu $(wildcard src/*/*.h src/backend/cuda/*.cuh)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@
$(BUILD)/libcinfer.a: $(OBJ)
	@rm -f $@; ar rcs $@ $^
# only cinfer_* is exported (libcinfer.map); SONAME libcinfer.so.$(SOMAJOR)
$(BUILD)/libcinfer.so.$(VERSION): $(OBJ) libcinfer.map
	$(CC) $(CFLAGS) -shared -Wl,-soname,libcinfer.so.$(SOMAJOR) -Wl,--version-script=libcinfer.map -o $@ $(OBJ) $(LDLIBS)
$(BUILD)/libcinfer.so: $(BUILD)/libcinfer.so.$(VERSION)
	ln -sf libcinfer.so.$(VERSION) $(BUILD)/libcinfer.so.$(SOMAJOR)
	ln -sf libcinfer.so.$(VERSION) $@
# the revision is compiled into status.c only, so a new commit rebuilds one file
$(BUILD)/src/engine/status.o: CFLAGS += $(VFLAGS)
$(BUILD)/src/engine/status.o: .git-rev
.git-rev: FORCE
	@echo '$(VERSION) $(GIT_REV)' | cmp -s - $@ || echo '$(VERSION) $(GIT_REV)' > $@
$(BUILD)/cinfer: $(CLIOBJ) $(BUILD)/libcinfer.a
	$(CC) $(CFLAGS) -o $@ $(CLIOBJ) $(BUILD)/libcinfer.a $(LDLIBS)
$(BUILD)/tests/%: tests/%.c $(BUILD)/libcinfer.a $(wildcard tests/*.h include/*.h src/*/*.h src/*/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libcinfer.a $(LDLIBS)
# the server's parser is compiled into its test from tools/cli
$(BUILD)/tests/test-serve-parse: $(wildcard tools/cli/serve-*.c tools/cli/serve*.h)
$(BUILD)/tests/test-serve-prefix: tools/cli/serve-prefix.c tools/cli/serve-prefix.h
$(BUILD)/bench/%: bench/%.c $(BUILD)/libcinfer.a $(wildcard include/*.h src/*/*.h src/*/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libcinfer.a $(LDLIBS)

# The whole suite: release build, then the same tests under ASan + UBSan.
test:
	./scripts/install-deps.sh >/dev/null
	$(MAKE) all tests BUILD=build
	$(MAKE) all tests BUILD=build-san SAN=1
	sh tests/run.sh build build-san

# make install PREFIX=DIR: the CLI, both libraries, the header, cinfer.pc
# (links libcinfer.so) and cinfer-static.pc (links libcinfer.a and its deps)
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(PREFIX)/include
	install -m 755 $(BUILD)/cinfer $(DESTDIR)$(PREFIX)/bin/cinfer
	install -m 644 $(BUILD)/libcinfer.a $(DESTDIR)$(LIBDIR)/libcinfer.a
	install -m 755 $(BUILD)/libcinfer.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libcinfer.so.$(VERSION)
	ln -sf libcinfer.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libcinfer.so.$(SOMAJOR)
	ln -sf libcinfer.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libcinfer.so
	install -m 644 include/cinfer.h $(DESTDIR)$(PREFIX)/include/cinfer.h
	sed -e 's|@PREFIX@|$(PREFIX)|; s|@LIBDIR@|$(LIBDIR)|; s|@VERSION@|$(VERSION)|; s|@LIBS_PRIVATE@|$(LDLIBS)|' \
	    cinfer.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/cinfer.pc
	sed -e 's|^Name: cinfer|Name: cinfer-static|; s|^Libs: .*|Libs: $${libdir}/libcinfer.a $(LDLIBS)|; /^Libs.private/d' \
	    $(DESTDIR)$(LIBDIR)/pkgconfig/cinfer.pc > $(DESTDIR)$(LIBDIR)/pkgconfig/cinfer-static.pc

clean:
	rm -rf build build-san .git-rev

.PHONY: all tests bench test clean install FORCE
