# CrucibleOptions.cmake — the knobs a preset turns: sanitizer, contract semantic, debug info.
#
# CRUCIBLE_SANITIZER: none | asan-ubsan | tsan | ubsan-strict
# CRUCIBLE_CONTRACTS: enforce | observe | ignore   (see include/crucible/core/Contract.h)
# CRUCIBLE_DEBUG_INFO: lines | full | none         (below)
# CRUCIBLE_UNITY_BUILD: ON in the checking presets (below)
set(CRUCIBLE_SANITIZER "none" CACHE STRING "none | asan-ubsan | tsan | ubsan-strict")
set_property(CACHE CRUCIBLE_SANITIZER PROPERTY STRINGS none asan-ubsan tsan ubsan-strict fuzzer)
set(CRUCIBLE_CONTRACTS "enforce" CACHE STRING "enforce | observe | ignore")
set_property(CACHE CRUCIBLE_CONTRACTS PROPERTY STRINGS enforce observe ignore)
option(CRUCIBLE_BUILD_TESTS "Build the test suite" ON)
option(CRUCIBLE_BUILD_BENCH "Build the benchmarks" ON)
# The Vessel's ablation switches (Note [Ablation build], vessel/torch/Capture.h): a benchmark's
# build (bench/vessel_ablation.sh), never a preset's.
option(CRUCIBLE_VESSEL_ABLATION "Give the recording kernels the switches bench/vessel_ablation.sh turns" OFF)
# OFF: the torch-free stages only, as on a machine without torch. The ubsan-strict preset (the
# build and tests without torch) and the fuzz preset turn it off; the default preset runs the
# Vessel and its Python suite under ASan and every check ubsan-strict has.
option(CRUCIBLE_WITH_TORCH "Build the PyTorch Vessel when CRUCIBLE_PYTHON imports torch" ON)
option(CRUCIBLE_BUILD_FUZZ "Build the libFuzzer harnesses (clang only: the fuzz preset)" OFF)
# Unity (jumbo) builds: each target's sources compiled eight to a translation unit, so the heavy
# headers (GoogleTest, torch, LLVM, toml++) are parsed once per batch instead of once per file.
# The checking presets turn it on: their builds are most of the suite's time, and the default
# preset's went from 3m57s to 2m44s on the 2-core machine. The release preset keeps
# one file per translation unit: it is what the benchmarks measure, and it is the build that
# catches a source relying on another file's includes or names.
option(CRUCIBLE_UNITY_BUILD "Compile each target's sources in batches (CMAKE_UNITY_BUILD)" OFF)
if(CRUCIBLE_UNITY_BUILD)
  set(CMAKE_UNITY_BUILD ON)
  set(CMAKE_UNITY_BUILD_BATCH_SIZE 8)
endif()

if(CRUCIBLE_CONTRACTS STREQUAL "enforce")
  set(_sem 2)
elseif(CRUCIBLE_CONTRACTS STREQUAL "observe")
  set(_sem 1)
elseif(CRUCIBLE_CONTRACTS STREQUAL "ignore")
  set(_sem 0)
else()
  message(FATAL_ERROR "CRUCIBLE_CONTRACTS='${CRUCIBLE_CONTRACTS}': use enforce, observe or ignore")
endif()
add_compile_definitions(CRUCIBLE_CONTRACT_SEMANTIC=${_sem} CRUCIBLE_SANITIZER_NAME="${CRUCIBLE_SANITIZER}")

# The interpreter that imports torch (Python tests and the extension): the project's .venv made
# by utils/bin/setup. Override with -DCRUCIBLE_PYTHON=... or the CRUCIBLE_PYTHON environment variable.
if(NOT CRUCIBLE_PYTHON)
  if(SKBUILD AND Python_EXECUTABLE)
    set(_py ${Python_EXECUTABLE})   # pip install .: the interpreter pip runs for
  elseif(DEFINED ENV{CRUCIBLE_PYTHON})
    set(_py $ENV{CRUCIBLE_PYTHON})
  elseif(EXISTS ${CMAKE_SOURCE_DIR}/.venv/bin/python)
    set(_py ${CMAKE_SOURCE_DIR}/.venv/bin/python)   # made by utils/bin/setup
  else()
    find_program(_py NAMES python3)
  endif()
  set(CRUCIBLE_PYTHON ${_py} CACHE FILEPATH "Python interpreter that imports torch")
endif()

set(CRUCIBLE_SAN_FLAGS "")
if(CRUCIBLE_SANITIZER STREQUAL "asan-ubsan")
  # UBSan with every check ubsan-strict has (float-divide-by-zero, -ftrapv), so the Vessel
  # gets them too.
  set(CRUCIBLE_SAN_FLAGS -fsanitize=address,undefined,float-divide-by-zero -fno-omit-frame-pointer
      -fno-sanitize-recover=undefined,float-divide-by-zero -ftrapv)
elseif(CRUCIBLE_SANITIZER STREQUAL "tsan")
  set(CRUCIBLE_SAN_FLAGS -fsanitize=thread -fno-omit-frame-pointer)
elseif(CRUCIBLE_SANITIZER STREQUAL "ubsan-strict")
  # Every UBSan check, no recovery; -ftrapv makes signed overflow trap even where UBSan's
  # instrumentation is elided.
  set(CRUCIBLE_SAN_FLAGS -fsanitize=undefined -fsanitize=float-divide-by-zero
      -fno-sanitize-recover=all -ftrapv -fno-omit-frame-pointer)
elseif(CRUCIBLE_SANITIZER STREQUAL "fuzzer")
  # Libraries get coverage instrumentation; harnesses add -fsanitize=fuzzer (with main).
  set(CRUCIBLE_SAN_FLAGS -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
      -fno-omit-frame-pointer)
elseif(NOT CRUCIBLE_SANITIZER STREQUAL "none")
  message(FATAL_ERROR "CRUCIBLE_SANITIZER='${CRUCIBLE_SANITIZER}': use none, asan-ubsan, tsan or ubsan-strict")
endif()
if(CRUCIBLE_SAN_FLAGS)
  add_compile_options(${CRUCIBLE_SAN_FLAGS})
  add_link_options(${CRUCIBLE_SAN_FLAGS})
endif()

add_compile_options(-Wall -Wextra -Wpedantic -Wno-unused-parameter)
# GCC 12 reports -Wrestrict false positives inside std::string's operator+ with a temporary
# ("'" + std::string(x): its bug 105329) at a dozen sites in release builds; off for it.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  add_compile_options(-Wno-restrict)
endif()
# Debug information: line tables by default (-g1). A sanitizer report, a backtrace, perf and
# callgrind need file:line, nothing more; full DWARF (types, variables) cost 35-40 % of the compile
# time of the suite's heaviest files (dispatch_test.cpp: 51 s at -O3 -g, 30 s at -O3 -g1). Pass
# -DCRUCIBLE_DEBUG_INFO=full for a debugger session that inspects variables.
set(CRUCIBLE_DEBUG_INFO "lines" CACHE STRING "lines (-g1) | full (-g) | none (-g0)")
set_property(CACHE CRUCIBLE_DEBUG_INFO PROPERTY STRINGS lines full none)
if(CRUCIBLE_DEBUG_INFO STREQUAL "lines")
  add_compile_options(-g1)
elseif(CRUCIBLE_DEBUG_INFO STREQUAL "full")
  add_compile_options(-g)
elseif(CRUCIBLE_DEBUG_INFO STREQUAL "none")
  add_compile_options(-g0)
else()
  message(FATAL_ERROR "CRUCIBLE_DEBUG_INFO='${CRUCIBLE_DEBUG_INFO}': use lines, full or none")
endif()

# One section per function/object, so that a deployed binary linked with --gc-sections keeps only
# the code it calls (examples/strip_cnn: less text to page in, a smaller resident set).
add_compile_options(-ffunction-sections -fdata-sections)
