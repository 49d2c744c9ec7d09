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
# Crucible::absl is every Abseil library the stages use. By default it is Debian's static
# archives (PIC, from libabsl-dev) in one rescanned link group, so that a binary or C API library
# needs no libabsl_*.so at load time: Debian splits Abseil into ~30 shared libraries, and loading
# them costs about 3 MB of resident memory (measured on the strip_cnn example), more than its
# whole inference. -DCRUCIBLE_ABSL_STATIC=OFF links the shared libraries instead.
option(CRUCIBLE_ABSL_STATIC "link Abseil statically (fewer shared libraries, smaller RSS)" ON)
add_library(crucible_absl INTERFACE)
add_library(Crucible::absl ALIAS crucible_absl)
if(CRUCIBLE_ABSL_STATIC)
  file(GLOB _absl_archives /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/libabsl_*.a)
  if(NOT _absl_archives)
    message(FATAL_ERROR "Abseil static archives not found: run utils/bin/setup (libabsl-dev), or configure with -DCRUCIBLE_ABSL_STATIC=OFF")
  endif()
  target_link_libraries(crucible_absl INTERFACE "$<LINK_GROUP:RESCAN,${_absl_archives}>" Threads::Threads)
else()
  target_link_libraries(crucible_absl INTERFACE absl::status absl::statusor absl::flat_hash_map
                        absl::flat_hash_set absl::hash)
endif()

find_package(OpenSSL QUIET)
crucible_require(OPENSSL_FOUND "OpenSSL" libssl-dev)

find_package(ZLIB QUIET)
crucible_require(ZLIB_FOUND "zlib" zlib1g-dev)

find_package(Threads REQUIRED)

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
add_library(Crucible::OpenBLAS INTERFACE IMPORTED GLOBAL)
target_include_directories(Crucible::OpenBLAS INTERFACE ${CRUCIBLE_OPENBLAS_INCLUDE})
target_link_libraries(Crucible::OpenBLAS INTERFACE ${CRUCIBLE_OPENBLAS_LIB})

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
