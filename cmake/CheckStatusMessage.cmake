# CheckStatusMessage.cmake — fails if a source reads a status's message with Status::message()
# instead of crucible::message_of() (Note [Old std::string ABI] in CrucibleDeps.cmake: the inline
# accessor reads Abseil's std::string with the wrong layout in a build for an old-ABI torch).
# std::error_code's message() (named `ec` by convention) is compiled libstdc++ code and allowed.
# Run as: cmake -DROOT=<source dir> -P CheckStatusMessage.cmake   (status_message_lint)
file(GLOB_RECURSE files ${ROOT}/include/*.h ${ROOT}/src/*.cpp ${ROOT}/src/*.h
                        ${ROOT}/vessel/*.cpp ${ROOT}/vessel/*.h)
set(errors "")
foreach(f IN LISTS files)
  if(f STREQUAL "${ROOT}/src/core/Status.cpp")
    continue()
  endif()
  file(STRINGS ${f} lines REGEX "\\.message\\(\\)")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "(^|[^A-Za-z0-9_])ec\\.message\\(\\)" "" rest "${line}")
    if(rest MATCHES "\\.message\\(\\)")
      string(APPEND errors "${f}: ${line}\n")
    endif()
  endforeach()
endforeach()
if(errors)
  message(FATAL_ERROR "read a status's message with crucible::message_of(status), not .message():\n${errors}")
endif()
message(STATUS "status messages: every source reads them through message_of")
