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

if(CRUCIBLE_BUILD_TESTS)
  find_package(GTest CONFIG QUIET)
  crucible_require(GTest_FOUND "GoogleTest" "libgtest-dev libgmock-dev")
endif()
if(CRUCIBLE_BUILD_BENCH)
  find_package(benchmark CONFIG QUIET)
  crucible_require(benchmark_FOUND "Google Benchmark" libbenchmark-dev)
endif()

# libtorch (libtorch-dev): optional for the torch-free stages, required for the PyTorch Vessel.
find_package(Torch CONFIG QUIET)
