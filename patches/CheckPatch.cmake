# CheckPatch.cmake — patches_apply_test: the PyTorch patch for the installed torch's major.minor
# (patches/pytorch-<major>.<minor>-crucible-dispatch-key.patch) applies to the installed torch's
# own copies of the files it changes, the patched headers compile with DispatchKey::Crucible above
# Autograd (and, where libc10 is found, a probe linked against it sees the key in its place in a
# DispatchKeySet), and the Vessel's dispatch code compiles against them with the dedicated key selected.
# cmake -DROOT=... -DWORK=... -DCXX=... -DINCLUDES="a;b" [-DTORCH_VERSION=2.13] -P CheckPatch.cmake
# Lines starting CHECKPATCH-SKIPPED say what could not be checked here, and why.
cmake_minimum_required(VERSION 3.20)
foreach(v ROOT WORK CXX INCLUDES)
  if(NOT DEFINED ${v} OR "${${v}}" STREQUAL "")
    message(FATAL_ERROR "CheckPatch.cmake needs -D${v}=...")
  endif()
endforeach()

# The torch headers: the include directory that has c10/core/DispatchKey.h.
set(torch_inc "")
foreach(d IN LISTS INCLUDES)
  if(NOT torch_inc AND EXISTS "${d}/c10/core/DispatchKey.h")
    set(torch_inc "${d}")
  endif()
endforeach()
if(NOT torch_inc)
  message(FATAL_ERROR "no c10/core/DispatchKey.h under INCLUDES (${INCLUDES})")
endif()

# The torch version, from its headers unless given.
if(NOT TORCH_VERSION)
  foreach(d IN LISTS INCLUDES)
    foreach(f torch/headeronly/version.h torch/csrc/api/include/torch/version.h torch/version.h)
      if(NOT TORCH_VERSION AND EXISTS "${d}/${f}")
        file(STRINGS "${d}/${f}" _maj REGEX "^#define TORCH_VERSION_MAJOR [0-9]+")
        file(STRINGS "${d}/${f}" _min REGEX "^#define TORCH_VERSION_MINOR [0-9]+")
        if(_maj AND _min)
          string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _maj "${_maj}")
          string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _min "${_min}")
          set(TORCH_VERSION "${_maj}.${_min}")
        endif()
      endif()
    endforeach()
  endforeach()
endif()
if(NOT TORCH_VERSION)
  message(FATAL_ERROR "cannot tell the torch version from INCLUDES (no TORCH_VERSION_MAJOR/MINOR in "
                      "torch/headeronly/version.h or torch/version.h); pass -DTORCH_VERSION=<major.minor>")
endif()
string(REGEX MATCH "^[0-9]+\\.[0-9]+" majmin "${TORCH_VERSION}")
set(patch_file "${ROOT}/patches/pytorch-${majmin}-crucible-dispatch-key.patch")
if(NOT EXISTS "${patch_file}")
  file(GLOB have RELATIVE "${ROOT}/patches" "${ROOT}/patches/pytorch-*-crucible-dispatch-key.patch")
  message(STATUS "CHECKPATCH-SKIPPED: the installed torch is ${TORCH_VERSION}; patches/ has no patch for "
                 "${majmin} (it has: ${have}). Nothing was checked.")
  return()
endif()

# The installed copies of the files the patch changes: c10/core/DispatchKey.h from the headers,
# torchgen/model.py where torch is a pip install (site-packages/torch/include -> site-packages/torchgen).
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/c10/core/impl")
file(COPY "${torch_inc}/c10/core/DispatchKey.h" DESTINATION "${WORK}/c10/core")
get_filename_component(site "${torch_inc}/../.." ABSOLUTE)
if(EXISTS "${site}/torchgen/model.py")
  file(COPY "${site}/torchgen/model.py" DESTINATION "${WORK}/torchgen")
endif()

# Keep the patch's sections for those files and for the files it creates; the others patch sources
# that an install does not have (c10/core/DispatchKey.cpp, torch/csrc/utils/python_dispatch.cpp):
# patches/check-apply checks those against a PyTorch checkout. (String functions only: the patch
# text has semicolons, which CMake's list functions would split on.)
file(READ "${patch_file}" text)
set(kept "")
set(left_out "")
set(applied "")
string(FIND "${text}" "diff --git " pos)
while(pos GREATER -1)
  string(SUBSTRING "${text}" ${pos} -1 rest)
  string(SUBSTRING "${rest}" 11 -1 after)
  string(FIND "${after}" "\ndiff --git " next)
  if(next GREATER -1)
    math(EXPR len "${next} + 12")
    string(SUBSTRING "${rest}" 0 ${len} section)
    math(EXPR pos "${pos} + ${len}")
  else()
    set(section "${rest}")
    set(pos -1)
  endif()
  string(REGEX MATCH "^diff --git a/([^ \n]+) b/" _ "${section}")
  set(path "${CMAKE_MATCH_1}")
  if(EXISTS "${WORK}/${path}" OR section MATCHES "\nnew file mode ")
    string(APPEND kept "${section}")
    string(APPEND applied " ${path}")
  else()
    string(APPEND left_out " ${path}")
  endif()
endwhile()
if(NOT applied MATCHES "c10/core/DispatchKey.h")
  message(FATAL_ERROR "${patch_file} does not change c10/core/DispatchKey.h")
endif()
file(WRITE "${WORK}/installed.patch" "${kept}")
execute_process(COMMAND patch -p1 --forward --batch --fuzz=0 -i "${WORK}/installed.patch"
                WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${patch_file} does not apply to the installed torch ${TORCH_VERSION} "
                      "(${torch_inc}):\n${out}${err}")
endif()
message(STATUS "applied to the installed torch ${TORCH_VERSION}:${applied}")
if(left_out)
  message(STATUS "not in an install, so not applied here (patches/check-apply checks them in a PyTorch checkout):${left_out}")
endif()

set(inc "-I${WORK}")
foreach(d IN LISTS INCLUDES)
  list(APPEND inc "-I${d}")
endforeach()

# The key's place, at compile time; its bit in a DispatchKeySet, at run time where libc10 is found
# (DispatchKeySet's has/highestPriorityTypeId are inline; the unpatched libc10 is not asked about
# the key). CrucibleTLS.cpp, which the patch adds to libc10, is compiled into the probe.
file(WRITE "${WORK}/probe.cpp" [=[
#include <c10/core/DispatchKey.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/CrucibleTLS.h>
#include <cstdio>
using c10::DispatchKey;
using c10::DispatchKeySet;
static_assert(DispatchKey::Crucible > DispatchKey::AutogradFunctionality, "Crucible must sit above Autograd");
static_assert(DispatchKey::Crucible < DispatchKey::PythonTLSSnapshot, "PythonTLSSnapshot must stay above Crucible");
static_assert(DispatchKey::Crucible < DispatchKey::EndOfFunctionalityKeys, "a functionality key");
int main() {
  const DispatchKeySet full(DispatchKeySet::FULL), after(DispatchKeySet::FULL_AFTER, DispatchKey::Crucible);
  const DispatchKeySet ks = DispatchKeySet(DispatchKey::Crucible) | DispatchKeySet(DispatchKey::AutogradCPU) |
                            DispatchKeySet(DispatchKey::CPU);
  const bool ok = full.has(DispatchKey::Crucible) && full.has(DispatchKey::PythonDispatcher) &&
                  !after.has(DispatchKey::Crucible) && !after.has(DispatchKey::PythonTLSSnapshot) &&
                  after.has(DispatchKey::FuncTorchBatched) && after.has(DispatchKey::AutogradCPU) &&
                  ks.highestPriorityTypeId() == DispatchKey::Crucible &&
                  (ks & after).highestPriorityTypeId() == DispatchKey::AutogradCPU &&
                  c10::impl::crucible_tls().mode == 0;
  std::printf("DispatchKey::Crucible = %d; key bits used: %d of 64; DispatchKeySet checks %s\n",
              static_cast<int>(DispatchKey::Crucible), c10::num_backends + c10::num_functionality_keys,
              ok ? "pass" : "FAIL");
  return ok ? 0 : 1;
}
]=])
set(c10_lib "")
foreach(d "${torch_inc}/../lib" "${torch_inc}/../../lib")
  if(NOT c10_lib AND EXISTS "${d}/libc10.so")
    get_filename_component(c10_lib "${d}" ABSOLUTE)
  endif()
endforeach()
if(c10_lib)
  execute_process(COMMAND "${CXX}" -std=c++17 ${inc} "${WORK}/probe.cpp" "${WORK}/c10/core/impl/CrucibleTLS.cpp"
                          -o "${WORK}/probe" -L${c10_lib} -lc10 -Wl,-rpath,${c10_lib}
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the patched headers do not compile:\n${err}")
  endif()
  execute_process(COMMAND "${WORK}/probe" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(STRIP "${out}" out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the probe built against the patched headers failed (${rc}): ${out}${err}")
  endif()
  message(STATUS "${out}")
else()
  execute_process(COMMAND "${CXX}" -std=c++17 -fsyntax-only ${inc} "${WORK}/probe.cpp" "${WORK}/c10/core/impl/CrucibleTLS.cpp"
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the patched headers do not compile:\n${err}")
  endif()
  message(STATUS "the patched headers compile with DispatchKey::Crucible above Autograd "
                 "(no libc10.so next to the headers: the run-time DispatchKeySet checks were skipped)")
endif()

# The Vessel with the dedicated key selected. When that fails, the same source against the
# unpatched headers without the key tells a patch problem from a Vessel that does not compile
# against this torch at all (then there is nothing to learn here about the patch).
set(vessel_flags -std=c++20 -fsyntax-only -w ${inc} "-I${ROOT}/include" "-I${ROOT}/vessel/torch")
execute_process(COMMAND "${CXX}" ${vessel_flags} -DCRUCIBLE_HAS_CRUCIBLE_KEY=1 "${ROOT}/vessel/torch/Dispatch.cpp"
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  set(plain_flags -std=c++20 -fsyntax-only -w)
  foreach(d IN LISTS INCLUDES)
    list(APPEND plain_flags "-I${d}")
  endforeach()
  execute_process(COMMAND "${CXX}" ${plain_flags} "-I${ROOT}/include" "-I${ROOT}/vessel/torch"
                          "${ROOT}/vessel/torch/Dispatch.cpp"
                  RESULT_VARIABLE rc_plain ERROR_VARIABLE err_plain)
  if(rc_plain EQUAL 0)
    message(FATAL_ERROR "vessel/torch/Dispatch.cpp compiles against the installed torch ${TORCH_VERSION} "
                        "but not with DispatchKey::Crucible selected (-DCRUCIBLE_HAS_CRUCIBLE_KEY=1):\n${err}")
  endif()
  string(REGEX MATCHALL "[^\n]*error:[^\n]*" errs "${err_plain}")
  list(LENGTH errs nerr)
  list(SUBLIST errs 0 5 first)
  list(JOIN first "\n  " first)
  message(STATUS "CHECKPATCH-SKIPPED: vessel/torch/Dispatch.cpp does not compile against the installed "
                 "torch ${TORCH_VERSION} even without the patch (${nerr} errors; the Vessel is not ported "
                 "to it yet), so whether it compiles with DispatchKey::Crucible was not checked. First errors:\n  ${first}")
  message(STATUS "patch applies to the installed torch ${TORCH_VERSION}; DispatchKey::Crucible compiles in "
                 "its place; the Vessel part was skipped")
  return()
endif()
message(STATUS "patch applies to the installed torch ${TORCH_VERSION}; DispatchKey::Crucible compiles in its "
               "place and is selected by the Vessel")
