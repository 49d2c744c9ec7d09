# CrucibleStage.cmake — one library target per pipeline stage.
#
#   crucible_stage(<stage> SOURCES ... [DEPENDS <earlier stages>] [LIBS <third-party>])
#
# The stage order is fixed here. A stage may name only stages before it in DEPENDS;
# anything else is a configure error, so the data-flow layering cannot rot silently.
# (test/core/layering_test also checks #include lines against the same order.)
set(CRUCIBLE_STAGE_ORDER core ptload record graph pipeline forge exec mimic runtime)

function(crucible_stage stage)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPENDS;LIBS" ${ARGN})
  list(FIND CRUCIBLE_STAGE_ORDER ${stage} _self)
  if(_self EQUAL -1)
    message(FATAL_ERROR "crucible_stage(${stage}): not a stage; known: ${CRUCIBLE_STAGE_ORDER}")
  endif()
  foreach(dep IN LISTS ARG_DEPENDS)
    list(FIND CRUCIBLE_STAGE_ORDER ${dep} _idx)
    if(_idx EQUAL -1 OR NOT _idx LESS _self)
      message(FATAL_ERROR "stage '${stage}' may not depend on '${dep}': a stage links only stages before it (${CRUCIBLE_STAGE_ORDER})")
    endif()
  endforeach()
  set(target crucible_${stage})
  add_library(${target} STATIC ${ARG_SOURCES})
  add_library(crucible::${stage} ALIAS ${target})
  target_include_directories(${target} PUBLIC ${CMAKE_SOURCE_DIR}/include)
  list(TRANSFORM ARG_DEPENDS PREPEND crucible_ OUTPUT_VARIABLE _deps)
  target_link_libraries(${target} PUBLIC ${_deps} ${ARG_LIBS})
endfunction()
