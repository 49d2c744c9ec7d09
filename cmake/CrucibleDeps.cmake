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

find_package(absl CONFIG QUIET)
crucible_require(absl_FOUND "Abseil" libabsl-dev)

find_package(OpenSSL QUIET)
crucible_require(OPENSSL_FOUND "OpenSSL" libssl-dev)

find_package(ZLIB QUIET)
crucible_require(ZLIB_FOUND "zlib" zlib1g-dev)

find_package(Threads REQUIRED)

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
