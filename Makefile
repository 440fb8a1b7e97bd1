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
LDLIBS  = -lopenblas $(PKG_LIBS) -lxxhash -lpthread -lm

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
  NVFLAGS = -O3 -std=c++17 -arch=sm_90a -Iinclude -Isrc -Xcompiler -fPIC --expt-relaxed-constexpr
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
$(BUILD)/libcinfer.so: $(OBJ)
	$(CC) $(CFLAGS) -shared -o $@ $^ $(LDLIBS)
$(BUILD)/cinfer: $(CLIOBJ) $(BUILD)/libcinfer.a
	$(CC) $(CFLAGS) -o $@ $(CLIOBJ) $(BUILD)/libcinfer.a $(LDLIBS)
$(BUILD)/tests/%: tests/%.c $(BUILD)/libcinfer.a $(wildcard tests/*.h include/*.h src/*/*.h src/*/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libcinfer.a $(LDLIBS)
# the server's parser is compiled into its test from tools/cli
$(BUILD)/tests/test-serve-parse: $(wildcard tools/cli/serve-*.c tools/cli/serve*.h)
$(BUILD)/bench/%: bench/%.c $(BUILD)/libcinfer.a $(wildcard include/*.h src/*/*.h src/*/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libcinfer.a $(LDLIBS)

# The whole suite: release build, then the same tests under ASan + UBSan.
test:
	./scripts/install-deps.sh >/dev/null
	$(MAKE) all tests BUILD=build
	$(MAKE) all tests BUILD=build-san SAN=1
	sh tests/run.sh build build-san

clean:
	rm -rf build build-san

.PHONY: all tests bench test clean
