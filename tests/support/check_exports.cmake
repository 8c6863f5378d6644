# cmake -DNM=<nm> -DOBJECTS=<object files> -DALLOWED=<regex> -P check_exports.cmake
# Fails unless every external symbol the objects define matches ALLOWED: code compiled for a
# wider instruction set must not define anything the rest of the library could link to.
foreach(object IN LISTS OBJECTS)
  execute_process(COMMAND ${NM} -C --defined-only --extern-only ${object}
                  OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${object}")
  endif()
  string(REPLACE "\n" ";" lines "${symbols}")
  foreach(line IN LISTS lines)
    if(line STREQUAL "")
      continue()
    endif()
    if(NOT line MATCHES "${ALLOWED}")
      message(FATAL_ERROR "${object} defines an external symbol besides its table: ${line}")
    endif()
    message(STATUS "ok: ${line}")
  endforeach()
endforeach()
