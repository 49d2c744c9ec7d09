# CheckPatch.cmake — patches_apply_test: the PyTorch patch applies to the installed 1.13 header,
# the patched headers compile with DispatchKey::Crucible above Autograd, and the Vessel's
# dispatch code compiles against them with the dedicated key selected.
# cmake -DROOT=... -DWORK=... -DCXX=... -DINCLUDES="a;b" -P CheckPatch.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/c10/core/impl)
file(COPY /usr/include/c10/core/DispatchKey.h DESTINATION ${WORK}/c10/core)
execute_process(COMMAND patch -p1 --forward --batch --fuzz=0 -i ${ROOT}/patches/pytorch-1.13-crucible-dispatch-key.patch
                WORKING_DIRECTORY ${WORK} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the patch does not apply to the installed PyTorch header:\n${out}${err}")
endif()
file(WRITE ${WORK}/probe.cpp "#include <c10/core/DispatchKey.h>
#include <c10/core/impl/CrucibleTLS.h>
static_assert(static_cast<int>(c10::DispatchKey::Crucible) > static_cast<int>(c10::DispatchKey::AutogradFunctionality), \"Crucible must sit above Autograd\");
static_assert(static_cast<int>(c10::DispatchKey::Crucible) < static_cast<int>(c10::DispatchKey::EndOfFunctionalityKeys), \"a functionality key\");
int main() { return c10::impl::CrucibleTLS{}.mode; }
")
set(inc -I${WORK})
foreach(d IN LISTS INCLUDES)
  list(APPEND inc -I${d})
endforeach()
execute_process(COMMAND ${CXX} -std=c++17 -fsyntax-only ${inc} ${WORK}/probe.cpp
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the patched headers do not compile:\n${err}")
endif()
execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only -DCRUCIBLE_HAS_CRUCIBLE_KEY=1 ${inc}
                        -I${ROOT}/include -I${ROOT}/vessel/torch ${ROOT}/vessel/torch/Dispatch.cpp
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "vessel/torch/Dispatch.cpp does not compile against the patched key:\n${err}")
endif()
message(STATUS "patch applies; DispatchKey::Crucible compiles and is selected by the Vessel")
