# CrucibleDeps.cmake — third-party libraries, each from a Debian package that
# utils/bin/setup installs. A missing one stops configure with the package to install.
find_package(PkgConfig REQUIRED)
function(crucible_require found what pkg)
  if(NOT ${found})
    message(FATAL_ERROR "${what} not found: run utils/bin/setup (Debian package ${pkg})")
  endif()
endfunction()

pkg_check_modules(XXHASH IMPORTED_TARGET libxxhash)
crucible_require(XXHASH_FOUND "xxHash" libxxhash-dev)

find_package(ZLIB QUIET)
crucible_require(ZLIB_FOUND "zlib" zlib1g-dev)
# libdeflate: only its CRC-32 (PCLMULQDQ, picked at run time), for .pt records. 14 GB/s on an
# EPYC core where zlib 1.2.13's crc32 does 4.2 GB/s, which made checksums 97% of
# StateDict::open on a 134 MB state dict (bench/python/pt_load_bench.py).
pkg_check_modules(LIBDEFLATE IMPORTED_TARGET libdeflate)
crucible_require(LIBDEFLATE_FOUND "libdeflate" libdeflate-dev)
find_package(Threads REQUIRED)
find_package(absl CONFIG QUIET)
crucible_require(absl_FOUND "Abseil" libabsl-dev)
# Crucible::absl, Crucible::zlib, Crucible::deflate and Crucible::xxhash are what the stages link: Debian's shared
# libraries, except in a target marked by crucible_deploy_binary() (below), which gets their
# static archives (Abseil's in one rescanned link group) and is linked fully static.
#
# Why: a small CNN's inference (examples/strip_cnn) should run in a few MB. Measured there, the
# dynamic build's peak RSS was 6.4 MB, of which ~3 MB were shared libraries being mapped in
# (Debian splits Abseil into ~30 of them); -static-libstdc++ with static Abseil gave 4.1 MB, a
# fully static binary 3.1 MB. Only stand-alone executables are marked: the archives use
# initial-exec TLS (no shared objects), and a binary that also loads our shared libraries must
# not hold a second copy of Abseil.
set(_deploy "$<BOOL:$<TARGET_PROPERTY:CRUCIBLE_DEPLOY_STATIC>>")
set(_absl_shared absl::status absl::statusor absl::flat_hash_map absl::flat_hash_set absl::hash)
file(GLOB _absl_archives /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/libabsl_*.a)
find_library(CRUCIBLE_ZLIB_ARCHIVE libz.a)
find_library(CRUCIBLE_XXHASH_ARCHIVE libxxhash.a)
find_library(CRUCIBLE_LIBDEFLATE_ARCHIVE libdeflate.a)
if(_absl_archives AND CRUCIBLE_ZLIB_ARCHIVE AND CRUCIBLE_XXHASH_ARCHIVE AND
   CRUCIBLE_LIBDEFLATE_ARCHIVE)
  set(CRUCIBLE_CAN_DEPLOY_STATIC ON)
endif()
add_library(crucible_absl INTERFACE)
add_library(Crucible::absl ALIAS crucible_absl)
add_library(crucible_zlib INTERFACE)
add_library(Crucible::zlib ALIAS crucible_zlib)
add_library(crucible_xxhash INTERFACE)
add_library(Crucible::xxhash ALIAS crucible_xxhash)
add_library(crucible_deflate INTERFACE)
add_library(Crucible::deflate ALIAS crucible_deflate)
if(CRUCIBLE_CAN_DEPLOY_STATIC)
  target_link_libraries(crucible_absl INTERFACE
    "$<${_deploy}:$<LINK_GROUP:RESCAN,${_absl_archives}>>" "$<$<NOT:${_deploy}>:${_absl_shared}>"
    Threads::Threads)
  target_link_libraries(crucible_zlib INTERFACE
    "$<${_deploy}:${CRUCIBLE_ZLIB_ARCHIVE}>" "$<$<NOT:${_deploy}>:ZLIB::ZLIB>")
  target_link_libraries(crucible_xxhash INTERFACE
    "$<${_deploy}:${CRUCIBLE_XXHASH_ARCHIVE}>" "$<$<NOT:${_deploy}>:PkgConfig::XXHASH>")
  target_link_libraries(crucible_deflate INTERFACE
    "$<${_deploy}:${CRUCIBLE_LIBDEFLATE_ARCHIVE}>" "$<$<NOT:${_deploy}>:PkgConfig::LIBDEFLATE>")
else()
  target_link_libraries(crucible_absl INTERFACE ${_absl_shared} Threads::Threads)
  target_link_libraries(crucible_zlib INTERFACE ZLIB::ZLIB)
  target_link_libraries(crucible_xxhash INTERFACE PkgConfig::XXHASH)
  target_link_libraries(crucible_deflate INTERFACE PkgConfig::LIBDEFLATE)
endif()

# A stand-alone binary meant for deployment (no Python, none of our shared libraries): linked
# fully static with unused sections dropped. Sanitizer builds (whose runtimes must be shared)
# and machines without the static archives link it like any other binary.
function(crucible_deploy_binary target)
  if(CRUCIBLE_SANITIZER STREQUAL "none" AND CRUCIBLE_CAN_DEPLOY_STATIC)
    set_target_properties(${target} PROPERTIES CRUCIBLE_DEPLOY_STATIC ON)
    target_link_options(${target} PRIVATE -static -Wl,--gc-sections)
  endif()
endfunction()

find_package(OpenSSL QUIET)
crucible_require(OPENSSL_FOUND "OpenSSL" libssl-dev)



# OpenBLAS, pthread flavour (libopenblas-pthread-dev). Debian keeps it in its own directory so
# that the BLAS alternative can be switched; link that one explicitly, never reference BLAS.
find_path(CRUCIBLE_OPENBLAS_INCLUDE cblas.h
          PATHS /usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-pthread NO_DEFAULT_PATH)
find_library(CRUCIBLE_OPENBLAS_LIB openblas
             PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-pthread NO_DEFAULT_PATH)
if(CRUCIBLE_OPENBLAS_INCLUDE AND CRUCIBLE_OPENBLAS_LIB)
  set(_openblas_found TRUE)
endif()
crucible_require(_openblas_found "OpenBLAS (pthread)" libopenblas-pthread-dev)
# (The runtime takes the header and dlopen()s the library: Note [Lazy OpenBLAS] in Linear.h.)

# PyTorch: optional for the torch-free stages, required for the PyTorch Vessel. Found from the
# interpreter that runs it (CRUCIBLE_PYTHON, CrucibleOptions.cmake), never from a fixed path:
# torch.utils.cmake_prefix_path holds its TorchConfig.cmake. What it reports is written into
# crucible_build.json, and crucible_native refuses a torch other than the one built against.
set(CRUCIBLE_TORCH_VERSION "")
set(CRUCIBLE_TORCH_CUDA "")
set(CRUCIBLE_TORCH_CXX11_ABI "")
if(NOT CRUCIBLE_WITH_TORCH)
  message(STATUS "CRUCIBLE_WITH_TORCH=OFF: the PyTorch Vessel is not built (torch-free stages only)")
elseif(CRUCIBLE_PYTHON)
  execute_process(
    COMMAND ${CRUCIBLE_PYTHON} -c
      "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.version.cuda or '')"
    RESULT_VARIABLE _torch_rc OUTPUT_VARIABLE _torch_out ERROR_VARIABLE _torch_err
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_torch_rc EQUAL 0)
    string(REPLACE "\n" ";" _torch_out "${_torch_out}")
    list(LENGTH _torch_out _n)
    if(_n LESS 3)
      message(FATAL_ERROR "${CRUCIBLE_PYTHON} printed an unexpected torch description: ${_torch_out}")
    endif()
    list(GET _torch_out 0 _torch_prefix)
    list(GET _torch_out 1 CRUCIBLE_TORCH_VERSION)
    list(GET _torch_out 2 CRUCIBLE_TORCH_CXX11_ABI)
    if(_n GREATER 3)
      list(GET _torch_out 3 CRUCIBLE_TORCH_CUDA)
    endif()
    if(CRUCIBLE_TORCH_VERSION VERSION_LESS 2.4)
      message(FATAL_ERROR "${CRUCIBLE_PYTHON} has torch ${CRUCIBLE_TORCH_VERSION}; Crucible needs torch 2.4 or "
                          "newer. Run utils/bin/setup (it makes .venv with torch 2.13.0), or point "
                          "CRUCIBLE_PYTHON at another interpreter.")
    endif()
    if(NOT CRUCIBLE_TORCH_CXX11_ABI STREQUAL "1")
      set(CRUCIBLE_TORCH_OLD_ABI ON)
    endif()
    message(STATUS "PyTorch ${CRUCIBLE_TORCH_VERSION} (CUDA: ${CRUCIBLE_TORCH_CUDA}) from ${CRUCIBLE_PYTHON}")
  else()
    message(WARNING "${CRUCIBLE_PYTHON} cannot import torch (${_torch_err}): the PyTorch Vessel is not built. "
                    "Run utils/bin/setup, or point CRUCIBLE_PYTHON at an interpreter with torch 2.4 or newer.")
  endif()
endif()
# CI builds the torch-free stages and the `crucible` command this way (CRUCIBLE_OLD_ABI=ON with
# CRUCIBLE_WITH_TORCH=OFF, utils/bin/test) and runs test/cli on it: a Debian C++ library that
# starts to share a std::string with the stages shows there.
option(CRUCIBLE_OLD_ABI "Build with the pre-C++11 std::string ABI without torch (Note [Old std::string ABI])" OFF)
if(CRUCIBLE_OLD_ABI)
  if(CRUCIBLE_TORCH_VERSION AND NOT CRUCIBLE_TORCH_OLD_ABI)
    message(FATAL_ERROR "CRUCIBLE_OLD_ABI=ON, but torch ${CRUCIBLE_TORCH_VERSION} (${CRUCIBLE_PYTHON}) is built "
                        "with the C++11 ABI: configure with -DCRUCIBLE_WITH_TORCH=OFF, or without CRUCIBLE_OLD_ABI")
  endif()
  set(CRUCIBLE_TORCH_OLD_ABI ON)
endif()
# Note [Old std::string ABI]: the pip wheels of torch 2.4 to 2.6 are built with the pre-C++11
# std::string ABI (_GLIBCXX_USE_CXX11_ABI=0). Code that passes strings to torch must use that
# ABI, and the Vessel shares its types (names, plans, messages) with every stage, so with such a
# torch the whole build uses it. Debian's compiled C++ libraries use the C++11 ABI, and a type
# holding a std::string (llvm::Triple, a toml++ table) crosses between the ABIs through symbols
# that carry no ABI tag: the two layouts mix without a link error. Abseil's parts linked here take
# string_view and pointers only (its one inline accessor that reads a std::string its compiled
# code wrote, Status::message(), is read through crucible::message_of, src/core/Status.cpp);
# toml++ is compiled from its headers (src/forge/CMakeLists.txt); GoogleTest, Google Benchmark
# and LLVM pass std::strings through their interfaces. So that build
# leaves out the C++ tests, the benchmarks and the Mimic CPU backend, and says so: recording,
# replay and plans of ATen calls work (plans()' exec_note says why no kernel is generated), the
# `crucible` command too (its `plan` without the CPU backend section), and the Python tests run.
if(CRUCIBLE_TORCH_OLD_ABI)
  set(_off "")
  foreach(_opt CRUCIBLE_BUILD_TESTS CRUCIBLE_BUILD_BENCH CRUCIBLE_BUILD_FUZZ CRUCIBLE_LLVM)
    if(NOT DEFINED ${_opt} OR ${_opt})
      list(APPEND _off ${_opt})
    endif()
    set(${_opt} OFF)   # a normal variable: the cache keeps the user's choice for another torch
  endforeach()
  add_compile_definitions(_GLIBCXX_USE_CXX11_ABI=0)
  list(JOIN _off ", " _off)
  if(CRUCIBLE_OLD_ABI)
    set(_why "CRUCIBLE_OLD_ABI=ON asks for the pre-C++11 std::string ABI")
  else()
    set(_why "torch ${CRUCIBLE_TORCH_VERSION} (${CRUCIBLE_PYTHON}) is built with the pre-C++11 std::string ABI")
  endif()
  message(WARNING "${_why}: the whole build uses that ABI, without what links Debian's C++ "
                  "libraries that pass strings (turned off: ${_off}). Generated kernels and the C++ "
                  "tests need a torch built with the C++11 ABI (every pip wheel from 2.7 on). "
                  "Note [Old std::string ABI] in cmake/CrucibleDeps.cmake.")
endif()
if(CRUCIBLE_BUILD_TESTS)
  find_package(GTest CONFIG QUIET)
  crucible_require(GTest_FOUND "GoogleTest" "libgtest-dev libgmock-dev")
endif()
if(CRUCIBLE_BUILD_BENCH)
  find_package(benchmark CONFIG QUIET)
  crucible_require(benchmark_FOUND "Google Benchmark" libbenchmark-dev)
endif()

# Crucible's own code uses c10 and ATen's CPU API only, so it links libtorch, libtorch_cpu and
# libc10 straight from the package (as torch.utils.cpp_extension does for a CPU extension), not
# through TorchConfig.cmake: for a CUDA build of torch that file demands a CUDA toolkit of the
# version torch was built with (a cu126 wheel beside CUDA 13 fails on nvrtc and nvToolsExt),
# which a user with a pip wheel and no toolkit does not have. libtorch_cuda is loaded by
# `import torch` and found through libtorch's own run path.
if(CRUCIBLE_TORCH_VERSION)
  set(_torch_lib "${_torch_prefix}/lib")
  set(TORCH_INCLUDE_DIRS "${_torch_prefix}/include" "${_torch_prefix}/include/torch/csrc/api/include")
  set(_torch_libs "")
  foreach(_l torch torch_cpu c10)
    if(NOT EXISTS "${_torch_lib}/lib${_l}.so")
      message(FATAL_ERROR "torch ${CRUCIBLE_TORCH_VERSION} imports from ${CRUCIBLE_PYTHON}, but "
                          "${_torch_lib}/lib${_l}.so is missing: reinstall torch")
    endif()
    list(APPEND _torch_libs "${_torch_lib}/lib${_l}.so")
  endforeach()
  if(NOT EXISTS "${_torch_prefix}/include/ATen/ATen.h")
    message(FATAL_ERROR "torch ${CRUCIBLE_TORCH_VERSION} imports from ${CRUCIBLE_PYTHON}, but its C++ headers "
                        "(${_torch_prefix}/include) are missing: reinstall torch")
  endif()
  add_library(Crucible::torch INTERFACE IMPORTED GLOBAL)
  set_target_properties(Crucible::torch PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${TORCH_INCLUDE_DIRS}"
    INTERFACE_LINK_LIBRARIES "${_torch_libs}"
    INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=${CRUCIBLE_TORCH_CXX11_ABI}")
  set(TORCH_LIBRARIES Crucible::torch)
  set(Torch_FOUND TRUE)
endif()

# CRUCIBLE_LLVM=OFF builds everything that does not generate code: no mimic stage, no
# _crucible_exec module (crucible.compile then replays ATen ops, its plans()' exec_note says
# why), a `crucible` command whose `plan` has no CPU backend section. For a machine that cannot
# have LLVM's packages, such as the GPU machine utils/bin/device-check builds on (LLVM 14 and what
# it loads are 40 MB of packages, over what can travel there beside the rest).
option(CRUCIBLE_LLVM "Build Mimic's CPU backend (LLVM) and what uses it" ON)
if(CRUCIBLE_LLVM)
  # LLVM, for the mimic stage's CPU code generator: 19 (what utils/bin/setup installs on Debian
  # 12 and 13), else 14; CRUCIBLE_LLVM_VERSION (a cache variable, from the environment at the
  # first configure) takes one of them only. Debian builds LLVM as one shared library
  # (LLVM_LINK_LLVM_DYLIB): the components this stage uses (orcjit, native, passes) are linked
  # from it, as static archives they would be tens of MB per binary (libLLVMCodeGen.a alone is
  # 16 MB in LLVM 14).
  set(CRUCIBLE_LLVM_VERSION "$ENV{CRUCIBLE_LLVM_VERSION}" CACHE STRING
      "LLVM major version of the CPU backend, 19 or 14 (empty: 19 if installed, else 14)")
  if(CRUCIBLE_LLVM_VERSION)
    set(_llvm_versions ${CRUCIBLE_LLVM_VERSION})
  else()
    set(_llvm_versions 19 14)
  endif()
  foreach(_v IN LISTS _llvm_versions)
    if(NOT LLVM_FOUND AND EXISTS /usr/lib/llvm-${_v}/lib/cmake/llvm)
      find_package(LLVM CONFIG QUIET PATHS /usr/lib/llvm-${_v}/lib/cmake/llvm NO_DEFAULT_PATH)
    endif()
  endforeach()
  if(NOT LLVM_FOUND AND NOT CRUCIBLE_LLVM_VERSION)
    find_package(LLVM CONFIG QUIET)   # LLVM_DIR, or an LLVM elsewhere on CMake's paths
  endif()
  crucible_require(LLVM_FOUND "LLVM" "llvm-19-dev or llvm-14-dev (utils/bin/setup)")
  if(CRUCIBLE_LLVM_VERSION AND NOT LLVM_VERSION_MAJOR STREQUAL CRUCIBLE_LLVM_VERSION)
    message(FATAL_ERROR "CRUCIBLE_LLVM_VERSION=${CRUCIBLE_LLVM_VERSION}, but LLVM ${LLVM_PACKAGE_VERSION} "
                        "was found (${LLVM_DIR}): configure a fresh build directory, or set "
                        "LLVM_DIR=/usr/lib/llvm-${CRUCIBLE_LLVM_VERSION}/lib/cmake/llvm")
  endif()
  add_library(crucible_llvm INTERFACE)
  add_library(Crucible::llvm ALIAS crucible_llvm)
  target_include_directories(crucible_llvm SYSTEM INTERFACE ${LLVM_INCLUDE_DIRS})
  separate_arguments(_llvm_defs NATIVE_COMMAND "${LLVM_DEFINITIONS}")
  target_compile_definitions(crucible_llvm INTERFACE ${_llvm_defs})
  if(LLVM_LINK_LLVM_DYLIB)
    target_link_libraries(crucible_llvm INTERFACE LLVM)
  else()
    llvm_map_components_to_libnames(_llvm_libs orcjit native passes)
    target_link_libraries(crucible_llvm INTERFACE ${_llvm_libs})
  endif()
  message(STATUS "LLVM ${LLVM_PACKAGE_VERSION} from ${LLVM_DIR}")
else()
  message(STATUS "CRUCIBLE_LLVM=OFF: no Mimic CPU backend, no _crucible_exec module (crucible plan: no CPU backend section)")
endif()
